package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DDL returns the statements that create the table and its indexes, for the
// given schema (empty for the search_path's) and table. The store runs them
// itself unless create_table is off; they are safe to run again.
func DDL(schema, table string) string {
	name := qualify(schema, table)
	index := pgx.Identifier{table + "_expires_at_idx"}.Sanitize()
	inFlight := pgx.Identifier{table + "_in_progress_idx"}.Sanitize()
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	key         bytea       PRIMARY KEY,
	state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
	token       bytea       NOT NULL,
	endpoint    text        NOT NULL,
	fingerprint bytea       NOT NULL,
	status      integer     NOT NULL DEFAULT 0,
	headers     jsonb,
	body        bytea,
	truncated   boolean     NOT NULL DEFAULT false,
	created_at  timestamptz NOT NULL DEFAULT now(),
	expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (expires_at);
CREATE INDEX IF NOT EXISTS %[3]s ON %[1]s (created_at) WHERE state = 'in_progress';
`, name, index, inFlight)
}

// qualify quotes the table name, so that it is used exactly as written.
func qualify(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

// queries are the statements of one table. Each store and Inspector
// method is one of them, one round trip; pgx prepares each once per
// connection.
type queries struct {
	acquire, complete, release, renew, reap string
	lookup, delete, inFlight                string
}

// owned is the condition under which a token may act on its claim: the
// same for Complete, Release and Renew, so that a claim whose lease has
// passed is dead to its old owner even before anyone takes it over.
const owned = `key = $1 AND token = $2 AND state = 'in_progress' AND expires_at > now()`

func newQueries(table string) queries {
	return queries{
		// live reads the key's unexpired row. claimed inserts the claim only
		// if live found none, and takes over an expired row in the same
		// statement: ON CONFLICT locks the row and rechecks expires_at on
		// its newest version, so two takeovers cannot both win. A replay
		// finds its record in live and writes nothing.
		//
		// Both CTEs see the snapshot of the statement's start, so when a
		// concurrent claim commits after it, claimed conflicts but live is
		// empty: the statement returns no row and Acquire runs it again.
		//
		// dead is the key's expired row in the same snapshot, if any: a
		// claim that wins replaced it, and took over a dead owner's lease
		// if it was in progress. It is read from the snapshot, like live,
		// not from the row version that ON CONFLICT locks. The two differ
		// only if the row changed in between: the reaper deleted it, or a
		// row committed meanwhile had already expired when the statement
		// began. The flag then follows the snapshot; the claim itself is
		// as atomic as ever.
		acquire: fmt.Sprintf(`WITH live AS (
	SELECT state, token, endpoint, fingerprint, status, headers, body, truncated, created_at
	FROM %[1]s WHERE key = $1 AND expires_at > now()
), dead AS (
	SELECT state FROM %[1]s WHERE key = $1 AND expires_at <= now()
), claimed AS (
	INSERT INTO %[1]s AS r (key, state, token, endpoint, fingerprint, created_at, expires_at)
	SELECT $1, 'in_progress', $2::bytea, $3::text, $4::bytea, now(), now() + $5::bigint * interval '1 microsecond'
	WHERE NOT EXISTS (SELECT FROM live)
	ON CONFLICT (key) DO UPDATE SET
		state = excluded.state, token = excluded.token, endpoint = excluded.endpoint,
		fingerprint = excluded.fingerprint, status = 0, headers = NULL, body = NULL,
		truncated = false, created_at = excluded.created_at, expires_at = excluded.expires_at
	WHERE r.expires_at <= now()
	RETURNING 1
)
SELECT true, EXISTS (SELECT FROM dead WHERE state = 'in_progress'),
	NULL::text, NULL::bytea, '', NULL::bytea, 0, NULL::jsonb, NULL::bytea, false, now() FROM claimed
UNION ALL
SELECT false, false, * FROM live`, table),

		complete: fmt.Sprintf(`UPDATE %s SET state = 'completed', status = $3, headers = $4, body = $5,
	truncated = $6, expires_at = now() + $7::bigint * interval '1 microsecond'
WHERE `+owned, table),

		release: fmt.Sprintf(`DELETE FROM %s WHERE `+owned, table),

		renew: fmt.Sprintf(`UPDATE %s SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE `+owned, table),

		// A TID scan deletes the batch the index found. The outer recheck
		// of expires_at matters: a row taken over since the inner SELECT is
		// a new, live version that must stay.
		reap: fmt.Sprintf(`DELETE FROM %[1]s
WHERE ctid = ANY (ARRAY(SELECT ctid FROM %[1]s WHERE expires_at <= now() LIMIT $1))
AND expires_at <= now()`, table),

		lookup: fmt.Sprintf(`SELECT state, token, endpoint, fingerprint, status, headers, body, truncated, created_at, expires_at
FROM %s WHERE key = $1 AND expires_at > now()`, table),

		delete: fmt.Sprintf(`DELETE FROM %s WHERE key = $1 RETURNING expires_at > now()`, table),

		// inFlight reads no body or headers. The DDL's partial index on
		// created_at WHERE state = 'in_progress' serves it (tables created
		// before that index existed scan their live rows instead).
		inFlight: fmt.Sprintf(`SELECT key, endpoint, created_at, expires_at FROM %s
WHERE state = 'in_progress' AND expires_at > now() AND created_at <= now() - $1::bigint * interval '1 microsecond'
ORDER BY created_at, key LIMIT $2`, table),
	}
}
