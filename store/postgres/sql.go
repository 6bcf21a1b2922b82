package postgres

import (
	"strconv"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// queries are the statements of one table: each store and Inspector call
// is one round trip, but for the takeover of an expired row. pgx prepares
// each once per connection.
type queries struct {
	acquire, takeover, complete, release, renew, watch, reap string
	lookup, delete, inFlight                                 string
}

// The statements of one key tell time by statement_timestamp(), when the
// statement itself started: in a batch (batch.go) they share a
// transaction, and now() would be the batch's start for all of them. For
// a statement alone the two are the same.
//
// The statements of one key find their row through the primary key alone:
// their state and expiry conditions are written in forms no index matches
// (state <> 'completed' is "in progress"). Otherwise the planner may walk
// the in-flight or reaper's index instead, for the connection's life, and
// those fill with dead entries under a stream of new keys.
const (
	isLive    = `(expires_at > statement_timestamp()) IS TRUE`
	isExpired = `(expires_at <= statement_timestamp()) IS TRUE`
)

// claimedBy is the condition that the token $2 holds the key's claim, its
// lease passed or not: so it may release it, since until a takeover its
// owner knows best what became of its request.
const claimedBy = `key = $1 AND token = $2 AND state <> 'completed'`

// owned is the condition under which a token may renew or complete its
// claim: a claim whose lease has passed is dead to its owner even before a
// takeover.
const owned = claimedBy + ` AND ` + isLive

// asInterval is n, a bigint of microseconds, as an interval of time alone:
// an interval of days would be added by the calendar of the session's time
// zone, an hour off across a change of daylight saving time.
func asInterval(n string) string { return `(` + n + `) * interval '1 microsecond'` }

// traceKept holds while a dead claim is kept for its dead owner: until its
// reap_at, however late the reaper comes.
const traceKept = `(reap_at > statement_timestamp()) IS TRUE`

// keptPastLease is how long a claim's row is kept past its lease, in
// microseconds: its TTL (NULL for a row without reap_at).
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
		created_at, expires_at - statement_timestamp() AS ttl
	FROM {table} WHERE key = $1
), claimed AS (
	INSERT INTO {table} (key, state, token, endpoint, fingerprint, created_at, expires_at, reap_at)
	SELECT $1, 'in_progress', $2::bytea, $3::bytea, $4::bytea, ` + pCreated + `,
		statement_timestamp() + ` + asInterval(pLease) + `, statement_timestamp() + ` + asInterval(pLease+" + "+pKeep) + `
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
		// A dead claim kept past its reap_at, which the reaper has not
		// reached yet, is gone: replaced as an expired record is.
		// A dead claim (in progress) is replaced by the claim, unwatched
		// (status 0), or with KeepUnknown ($8) becomes, in place, the
		// unknown outcome of its request: completed, bound as it was,
		// kept for the TTL, under the new token, and its waiters told.
		// An expired record is replaced by the claim either way.
		takeover: names.Replace(`WITH dead AS (
	SELECT state <> 'completed' AND ` + traceKept + ` AS claim, ` + pKeepUnknown + ` AND state <> 'completed' AND ` + traceKept + ` AS unknown,
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
	expires_at = statement_timestamp() + ` + asInterval(`CASE WHEN dead.unknown THEN `+pKeep+` ELSE `+pLease+` END`) + `,
	reap_at = CASE WHEN dead.unknown THEN NULL ELSE statement_timestamp() + ` + asInterval(pLease+" + "+pKeep) + ` END
FROM dead WHERE t.key = $1
RETURNING CASE WHEN dead.unknown AND dead.watched THEN ` + notifyEnded + ` END,
	dead.claim, t.expires_at - statement_timestamp(), t.state, t.token, t.endpoint, t.fingerprint, t.status, t.headers, t.body,
	t.truncated, t.outcome_unknown, t.sealed, t.created_at`),

		complete: names.Replace(`UPDATE {table} SET state = 'completed', status = $3, headers = $4, body = $5,
	truncated = $6, outcome_unknown = $7, sealed = $8,
	expires_at = statement_timestamp() + ` + asInterval(`$9::bigint`) + `, reap_at = NULL
WHERE ` + owned + ended),

		release: names.Replace(`DELETE FROM {table} WHERE ` + claimedBy + ended),

		// renew moves the time the claim is kept until with its lease.
		renew: names.Replace(`UPDATE {table} SET expires_at = statement_timestamp() + ` + asInterval(`$3::bigint`) + `,
	reap_at = statement_timestamp() + ` + asInterval(`$3::bigint + `+keptPastLease) + `
WHERE ` + owned),

		watch: names.Replace(`UPDATE {table} SET status = ` + watchedMark + `
WHERE key = $1 AND state <> 'completed' AND ` + isLive),

		// A TID scan deletes the batch the index found. The outer recheck
		// keeps a row taken over since the inner SELECT.
		reap: names.Replace(`DELETE FROM {table}
WHERE ctid = ANY (ARRAY(SELECT ctid FROM {table} WHERE ` + reapTime + ` <= now() LIMIT $1))
AND ` + reapTime + ` <= now()`),

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
