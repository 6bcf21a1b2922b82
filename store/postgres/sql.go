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
// UTF-8. reap_at is when the reaper may delete the row: expires_at for a
// completed record, but the claim's TTL past its lease for a claim, so
// that a dead owner's claim is still found, to be taken over, by a retry
// within TTL. The reaper's index is on reap_at, so that it finds only rows
// it may delete, however many dead claims it must keep.
func DDL(schema, table string) string {
	return strings.NewReplacer(
		"{table}", qualify(schema, table),
		"{reap_idx}", pgx.Identifier{indexName(table, reapIndex)}.Sanitize(),
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
	expires_at      timestamptz NOT NULL,
	reap_at         timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS {reap_idx} ON {table} (reap_at);
CREATE INDEX IF NOT EXISTS {in_progress_idx} ON {table} (created_at) WHERE state = 'in_progress';
`)
}

// What the table's indexes serve, in their names: the reaper, and the
// claims in flight that the admin API lists.
const (
	reapIndex     = "reap_at"
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
// the in-flight or reaper's index instead, for the connection's life, and
// those fill with dead entries under a stream of new keys.
const (
	isLive    = `(expires_at > now()) IS TRUE`
	isExpired = `(expires_at <= now()) IS TRUE`
)

// owned is the condition under which a token may act on its claim: a claim
// whose lease has passed is dead to its owner even before a takeover.
const owned = `key = $1 AND token = $2 AND state <> 'completed' AND ` + isLive

// asInterval is n, a bigint of microseconds, as an interval of time alone:
// an interval of days would be added by the calendar of the session's time
// zone, an hour off across a change of daylight saving time.
func asInterval(n string) string { return `(` + n + `) * interval '1 microsecond'` }

// keptPastLease is how long a claim's row is kept past its lease, in
// microseconds: its TTL.
const keptPastLease = `(extract(epoch FROM reap_at - expires_at) * 1000000)::bigint`

// Only ends of claims someone waits for are notified: PostgreSQL
// serializes every NOTIFY at commit across the cluster. A waiter sets the
// claim's status, unused until completion, to watchedStatus (watch); the
// completion and release then notify (ended), as does the takeover that
// makes a dead claim its unknown outcome. The row's lock orders the mark
// and the end: the waiter reads the completion, or the completion sees the
// mark. A purge always notifies, for the tiers.
const watchedStatus = -1

// watchedMark is watchedStatus as SQL.
var watchedMark = strconv.Itoa(watchedStatus)

// notifyEnded is the notification of the end of the key's claim.
const notifyEnded = `pg_notify({channel}, '` + string(store.EventEnded) + `' || encode(key, 'hex')) IS NOT NULL`

// ended is the condition that the completion and release add: it notifies
// the end of a watched claim.
var ended = ` AND CASE WHEN status = ` + watchedMark + ` THEN ` + notifyEnded + ` ELSE true END`

// The parameters of acquire and takeover, in Acquire's order.
const (
	pLease       = `$5::bigint` // microseconds
	pCreated     = `'epoch'::timestamptz + $6::bigint * interval '1 microsecond'`
	pKeep        = `$7::bigint` // the claim's TTL, microseconds
	pKeepUnknown = `$8::boolean`
)

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
	INSERT INTO {table} (key, state, token, endpoint, fingerprint, created_at, expires_at, reap_at)
	SELECT $1, 'in_progress', $2::bytea, $3::bytea, $4::bytea, ` + pCreated + `,
		now() + ` + asInterval(pLease) + `, now() + ` + asInterval(pLease+" + "+pKeep) + `
	WHERE NOT EXISTS (SELECT FROM old)
	ON CONFLICT (key) DO NOTHING
	RETURNING 1
)
SELECT true, NULL::interval, NULL::text, NULL::bytea, NULL::bytea, NULL::bytea, 0, NULL::bytea, NULL::bytea,
	false, false, false, NULL::timestamptz FROM claimed
UNION ALL
SELECT false, ttl, state, token, endpoint, fingerprint, status, headers, body, truncated, outcome_unknown, sealed,
	created_at FROM old`),

		// takeover replaces the key's expired row, and says what it
		// replaced: dead locks the row and, should another statement
		// have changed it since this one's snapshot, reads its newest
		// version, which it keeps only if still expired. So two
		// takeovers cannot both win, and the one that wins reports the
		// row it replaced, not the one the claim's statement read.
		//
		// A dead claim (in progress) is replaced by the claim, unwatched
		// (status 0), or with KeepUnknown ($8) becomes, in place, the
		// unknown outcome of its request: completed, bound as it was,
		// kept for the TTL, under the new token, and its waiters told.
		// An expired record is replaced by the claim either way.
		takeover: names.Replace(`WITH dead AS (
	SELECT state <> 'completed' AS claim, ` + pKeepUnknown + ` AND state <> 'completed' AS unknown,
		status = ` + watchedMark + ` AS watched
	FROM {table} WHERE key = $1 AND ` + isExpired + `
	FOR UPDATE
)
UPDATE {table} AS t SET state = CASE WHEN dead.unknown THEN 'completed' ELSE 'in_progress' END,
	token = $2,
	endpoint = CASE WHEN dead.unknown THEN t.endpoint ELSE $3::bytea END,
	fingerprint = CASE WHEN dead.unknown THEN t.fingerprint ELSE $4::bytea END,
	created_at = CASE WHEN dead.unknown THEN t.created_at ELSE ` + pCreated + ` END,
	status = 0, headers = NULL, body = NULL, truncated = false, outcome_unknown = dead.unknown, sealed = false,
	expires_at = now() + ` + asInterval(`CASE WHEN dead.unknown THEN `+pKeep+` ELSE `+pLease+` END`) + `,
	reap_at = now() + ` + asInterval(`CASE WHEN dead.unknown THEN `+pKeep+` ELSE `+pLease+` + `+pKeep+` END`) + `
FROM dead WHERE t.key = $1
RETURNING CASE WHEN dead.unknown AND dead.watched THEN ` + notifyEnded + ` END,
	dead.claim, t.expires_at - now(), t.state, t.token, t.endpoint, t.fingerprint, t.status, t.headers, t.body,
	t.truncated, t.outcome_unknown, t.sealed, t.created_at`),

		complete: names.Replace(`UPDATE {table} SET state = 'completed', status = $3, headers = $4, body = $5,
	truncated = $6, outcome_unknown = $7, sealed = $8,
	expires_at = now() + ` + asInterval(`$9::bigint`) + `, reap_at = now() + ` + asInterval(`$9::bigint`) + `
WHERE ` + owned + ended),

		release: names.Replace(`DELETE FROM {table} WHERE ` + owned + ended),

		// renew moves the time the claim is kept until with its lease.
		renew: names.Replace(`UPDATE {table} SET expires_at = now() + ` + asInterval(`$3::bigint`) + `,
	reap_at = now() + ` + asInterval(`$3::bigint + `+keptPastLease) + `
WHERE ` + owned),

		watch: names.Replace(`UPDATE {table} SET status = ` + watchedMark + `
WHERE key = $1 AND state <> 'completed' AND ` + isLive),

		// A TID scan deletes the batch the index found. The outer recheck
		// keeps a row taken over since the inner SELECT.
		reap: names.Replace(`DELETE FROM {table}
WHERE ctid = ANY (ARRAY(SELECT ctid FROM {table} WHERE reap_at <= now() LIMIT $1))
AND reap_at <= now()`),

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
