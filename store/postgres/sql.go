package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"

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
	return strings.NewReplacer(
		"{table}", qualify(schema, table),
		"{expires_at_idx}", pgx.Identifier{indexName(table, expiryIndex)}.Sanitize(),
		"{in_progress_idx}", pgx.Identifier{indexName(table, inFlightIndex)}.Sanitize(),
	).Replace(`CREATE TABLE IF NOT EXISTS {table} (
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
CREATE INDEX IF NOT EXISTS {expires_at_idx} ON {table} (expires_at);
CREATE INDEX IF NOT EXISTS {in_progress_idx} ON {table} (created_at) WHERE state = 'in_progress';
`)
}

// What the table's indexes serve, in their names: the reaper's expiry, and
// the claims in flight that the admin API lists.
const (
	expiryIndex   = "expires_at"
	inFlightIndex = "in_progress"
)

// indexHashBytes is how much of the table name's hash an index name
// carries, and indexPrefix how much of the table's name: with the longest
// purpose, the name fills maxIdentifier.
const (
	indexHashBytes = 4
	indexPrefix    = maxIdentifier - len("_"+inFlightIndex+"_") - 2*indexHashBytes
)

// indexName names table's index for purpose: the start of the table's
// name, the purpose, and a hash of the whole name. PostgreSQL cuts names
// at 63 bytes, so that table + "_" + purpose would, for a long table,
// become the table's own name or the other index's, and CREATE INDEX IF
// NOT EXISTS would skip the index without a word.
func indexName(table, purpose string) string {
	table = strings.ReplaceAll(table, "\x00", "") // as pgx drops it from identifiers
	sum := sha256.Sum256([]byte(table))
	n := min(len(table), indexPrefix)
	for n < len(table) && !utf8.RuneStart(table[n]) { // no rune cut in two
		n--
	}
	return table[:n] + "_" + purpose + "_" + hex.EncodeToString(sum[:indexHashBytes])
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

// watchedMark is watchedStatus as SQL.
var watchedMark = strconv.Itoa(watchedStatus)

// ended is the condition that the completion and release add: it notifies
// the end of a watched claim.
var ended = ` AND CASE WHEN status = ` + watchedMark + ` THEN pg_notify({channel}, '` + string(store.EventEnded) +
	`' || encode(key, 'hex')) IS NOT NULL ELSE true END`

// newQueries returns the statements of table, whose events go to channel
// (a quoted literal). The names go in by a single-pass replacement, never
// through a format verb: a name is used as written, %, braces and all.
func newQueries(table, channel string) queries {
	names := strings.NewReplacer("{table}", table, "{channel}", channel)
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
		acquire: names.Replace(`WITH old AS (
	SELECT state, token, endpoint, fingerprint, status, headers, body, truncated, outcome_unknown, sealed,
		created_at, expires_at - now() AS ttl
	FROM {table} WHERE key = $1
), claimed AS (
	INSERT INTO {table} (key, state, token, endpoint, fingerprint, created_at, expires_at)
	SELECT $1, 'in_progress', $2::bytea, $3::bytea, $4::bytea, 'epoch'::timestamptz + $6::bigint * interval '1 microsecond', now() + $5::bigint * interval '1 microsecond'
	WHERE NOT EXISTS (SELECT FROM old)
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
)
SELECT true, NULL::interval, NULL::text, NULL::bytea, NULL::bytea, NULL::bytea, 0, NULL::bytea, NULL::bytea,
	false, false, false, NULL::timestamptz FROM claimed
UNION ALL
SELECT false, ttl, state, token, endpoint, fingerprint, status, headers, body, truncated, outcome_unknown, sealed,
	created_at FROM old`),

		// takeover replaces the key's expired row with the claim. The
		// update locks the row and rechecks expires_at on its newest
		// version, so two takeovers cannot both win. Status 0: unwatched.
		takeover: names.Replace(`UPDATE {table} SET state = 'in_progress', token = $2, endpoint = $3, fingerprint = $4,
	status = 0, headers = NULL, body = NULL, truncated = false, outcome_unknown = false, sealed = false,
	created_at = 'epoch'::timestamptz + $6::bigint * interval '1 microsecond', expires_at = now() + $5::bigint * interval '1 microsecond'
WHERE key = $1 AND ` + isExpired),

		complete: names.Replace(`UPDATE {table} SET state = 'completed', status = $3, headers = $4, body = $5,
	truncated = $6, outcome_unknown = $7, sealed = $8, expires_at = now() + $9::bigint * interval '1 microsecond'
WHERE ` + owned + ended),

		release: names.Replace(`DELETE FROM {table} WHERE ` + owned + ended),

		renew: names.Replace(`UPDATE {table} SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE ` + owned),

		watch: names.Replace(`UPDATE {table} SET status = ` + watchedMark + `
WHERE key = $1 AND state <> 'completed' AND ` + isLive),

		// A TID scan deletes the batch the index found. The outer recheck
		// keeps a row taken over since the inner SELECT.
		reap: names.Replace(`DELETE FROM {table}
WHERE ctid = ANY (ARRAY(SELECT ctid FROM {table} WHERE expires_at <= now() LIMIT $1))
AND expires_at <= now()`),

		lookup: names.Replace(`SELECT expires_at, state, token, endpoint, fingerprint, status, headers, body, truncated,
	outcome_unknown, sealed, created_at
FROM {table} WHERE key = $1 AND ` + isLive),

		// delete notifies even without a row: a tier may hold a record
		// whose row is gone.
		delete: names.Replace(`WITH gone AS (DELETE FROM {table} WHERE key = $1 RETURNING expires_at > now() AS live)
SELECT coalesce((SELECT live FROM gone), false), pg_notify({channel}, '` + string(store.EventPurged) + `' || encode($1, 'hex')) IS NOT NULL`),

		// inFlight reads no body or headers; the partial index on
		// created_at serves it.
		inFlight: names.Replace(`SELECT key, endpoint, created_at, expires_at FROM {table}
WHERE state = 'in_progress' AND expires_at > now() AND created_at <= now() - $1::bigint * interval '1 microsecond'
ORDER BY created_at, key LIMIT $2`),
	}
}
