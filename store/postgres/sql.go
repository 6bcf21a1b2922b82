package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// DDL returns the statements, safe to run again, that create the table and
// its indexes for schema (empty for the search_path's) and table.
//
// state has no CHECK constraint: PostgreSQL compiles one on every statement
// that writes the table. endpoint is bytea: text refuses NUL and invalid
// UTF-8.
func DDL(schema, table string) string {
	name := qualify(schema, table)
	index := pgx.Identifier{table + "_expires_at_idx"}.Sanitize()
	inFlight := pgx.Identifier{table + "_in_progress_idx"}.Sanitize()
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	key             bytea       PRIMARY KEY,
	state           text        NOT NULL,
	token           bytea       NOT NULL,
	endpoint        bytea       NOT NULL,
	fingerprint     bytea       NOT NULL,
	status          integer     NOT NULL DEFAULT 0,
	headers         bytea,
	body            bytea,
	truncated       boolean     NOT NULL DEFAULT false,
	outcome_unknown boolean     NOT NULL DEFAULT false,
	sealed          boolean     NOT NULL DEFAULT false,
	created_at      timestamptz NOT NULL DEFAULT now(),
	expires_at      timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (expires_at);
CREATE INDEX IF NOT EXISTS %[3]s ON %[1]s (created_at) WHERE state = 'in_progress';
`, name, index, inFlight)
}

// qualify quotes the table name, to be used exactly as written.
func qualify(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

// queries are the statements of one table: each store and Inspector call
// is one round trip, but for the takeover of an expired row. pgx prepares
// each once per connection.
type queries struct {
	acquire, takeover, complete, release, renew, watch, reap string
	lookup, delete, inFlight                                 string
}

// The statements of one key find their row through the primary key alone:
// their state and expiry conditions are written in forms no index matches
// (state <> 'completed' is "in progress"). Otherwise the planner may walk
// the in-flight or expires_at index instead, for the connection's life,
// and those fill with dead entries under a stream of new keys.
const (
	isLive    = `(expires_at > now()) IS TRUE`
	isExpired = `(expires_at <= now()) IS TRUE`
)

// owned is the condition under which a token may act on its claim: a claim
// whose lease has passed is dead to its owner even before a takeover.
const owned = `key = $1 AND token = $2 AND state <> 'completed' AND ` + isLive

// Only ends of claims someone waits for are notified: PostgreSQL
// serializes every NOTIFY at commit across the cluster. A waiter sets the
// claim's status, unused until completion, to watchedStatus (watch); the
// completion and release then notify (ended). The row's lock
// orders the mark and the end: the waiter reads the completion, or the
// completion sees the mark. A purge always notifies, for the tiers.
const watchedStatus = -1

// newQueries returns the statements of table, whose events go to channel
// (a quoted literal).
func newQueries(table, channel string) queries {
	// ended is the condition of the completion and release.
	ended := fmt.Sprintf(` AND CASE WHEN status = %d THEN pg_notify(%s, '%c' || encode(key, 'hex')) IS NOT NULL ELSE true END`,
		watchedStatus, channel, store.EventEnded)
	return queries{
		// acquire reads the key's row in the statement's snapshot, and
		// inserts the claim if there is none: the primary key makes the
		// insert atomic, and ON CONFLICT DO NOTHING neither locks nor
		// writes. An expired row comes back with a ttl that is not
		// positive, for takeover to replace (an ON CONFLICT DO UPDATE
		// here would cost every run, replays included).
		//
		// Both CTEs see the snapshot of the statement's start, so when a
		// concurrent claim commits after it, claimed conflicts but old
		// holds no row: no row is returned and Acquire runs it again.
		acquire: fmt.Sprintf(`WITH old AS (
	SELECT state, token, endpoint, fingerprint, status, headers, body, truncated, outcome_unknown, sealed,
		created_at, expires_at - now() AS ttl
	FROM %[1]s WHERE key = $1
), claimed AS (
	INSERT INTO %[1]s (key, state, token, endpoint, fingerprint, created_at, expires_at)
	SELECT $1, 'in_progress', $2::bytea, $3::bytea, $4::bytea, 'epoch'::timestamptz + $6::bigint * interval '1 microsecond', now() + $5::bigint * interval '1 microsecond'
	WHERE NOT EXISTS (SELECT FROM old)
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
)
SELECT true, NULL::interval, NULL::text, NULL::bytea, NULL::bytea, NULL::bytea, 0, NULL::bytea, NULL::bytea,
	false, false, false, NULL::timestamptz FROM claimed
UNION ALL
SELECT false, ttl, state, token, endpoint, fingerprint, status, headers, body, truncated, outcome_unknown, sealed,
	created_at FROM old`, table),

		// takeover replaces the key's expired row with the claim. The
		// update locks the row and rechecks expires_at on its newest
		// version, so two takeovers cannot both win. Status 0: unwatched.
		takeover: fmt.Sprintf(`UPDATE %s SET state = 'in_progress', token = $2, endpoint = $3, fingerprint = $4,
	status = 0, headers = NULL, body = NULL, truncated = false, outcome_unknown = false, sealed = false,
	created_at = 'epoch'::timestamptz + $6::bigint * interval '1 microsecond', expires_at = now() + $5::bigint * interval '1 microsecond'
WHERE key = $1 AND `+isExpired, table),

		complete: fmt.Sprintf(`UPDATE %s SET state = 'completed', status = $3, headers = $4, body = $5,
	truncated = $6, outcome_unknown = $7, sealed = $8, expires_at = now() + $9::bigint * interval '1 microsecond'
WHERE `+owned+ended, table),

		release: fmt.Sprintf(`DELETE FROM %s WHERE `+owned+ended, table),

		renew: fmt.Sprintf(`UPDATE %s SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE `+owned, table),

		watch: fmt.Sprintf(`UPDATE %s SET status = %d
WHERE key = $1 AND state <> 'completed' AND `+isLive, table, watchedStatus),

		// A TID scan deletes the batch the index found. The outer recheck
		// keeps a row taken over since the inner SELECT.
		reap: fmt.Sprintf(`DELETE FROM %[1]s
WHERE ctid = ANY (ARRAY(SELECT ctid FROM %[1]s WHERE expires_at <= now() LIMIT $1))
AND expires_at <= now()`, table),

		lookup: fmt.Sprintf(`SELECT expires_at, state, token, endpoint, fingerprint, status, headers, body, truncated,
	outcome_unknown, sealed, created_at
FROM %s WHERE key = $1 AND `+isLive, table),

		// delete notifies even without a row: a tier may hold a record
		// whose row is gone.
		delete: fmt.Sprintf(`WITH gone AS (DELETE FROM %s WHERE key = $1 RETURNING expires_at > now() AS live)
SELECT coalesce((SELECT live FROM gone), false), pg_notify(%s, '%c' || encode($1, 'hex')) IS NOT NULL`,
			table, channel, store.EventPurged),

		// inFlight reads no body or headers; the partial index on
		// created_at serves it.
		inFlight: fmt.Sprintf(`SELECT key, endpoint, created_at, expires_at FROM %s
WHERE state = 'in_progress' AND expires_at > now() AND created_at <= now() - $1::bigint * interval '1 microsecond'
ORDER BY created_at, key LIMIT $2`, table),
	}
}
