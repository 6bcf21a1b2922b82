package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// queries are the statements of one table. Each store method is one of
// them, one round trip; pgx prepares each once per connection.
type queries struct {
	acquire, complete, release, renew, reap string
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
	'', ''::bytea, '', ''::bytea, 0, NULL::jsonb, NULL::bytea, false, now() FROM claimed
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
	}
}

// acquireAttempts bounds the reruns of the Acquire statement. A rerun
// happens only when the key changed between the statement's snapshot and
// its insert, which a second run sees; more is contention beyond reason.
const acquireAttempts = 5

// Acquire claims key for c, or returns its live record, in one statement.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (*store.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := s.db.ensure(ctx); err != nil {
		return nil, err
	}
	c.TookOver = false
	for range acquireAttempts {
		var (
			won, tookOver                     bool
			state, endpoint                   string
			token, fingerprint, headers, body []byte
			status                            int32
			truncated                         bool
			created                           time.Time
		)
		err := s.db.pool.QueryRow(ctx, s.db.q.acquire, key[:], c.Token[:], c.Endpoint, c.Fingerprint[:], micros(c.Lease)).
			Scan(&won, &tookOver, &state, &token, &endpoint, &fingerprint, &status, &headers, &body, &truncated, &created)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, s.unavailable("acquiring", err)
		}
		if won {
			c.TookOver, c.CreatedAt = tookOver, created
			return nil, nil
		}
		rec := &store.Record{
			Endpoint:  endpoint,
			CreatedAt: created,
			Status:    int(status),
			Body:      body,
			Truncated: truncated,
		}
		switch state {
		case "in_progress":
			rec.State = store.InProgress
		case "completed":
			rec.State = store.Completed
		default:
			return nil, s.unavailable("decoding record", fmt.Errorf("unknown state %q", state))
		}
		if len(token) != len(rec.Token) || len(fingerprint) != len(rec.Fingerprint) {
			return nil, s.unavailable("decoding record", errors.New("token or fingerprint of the wrong size"))
		}
		copy(rec.Token[:], token)
		copy(rec.Fingerprint[:], fingerprint)
		if headers != nil {
			if err := json.Unmarshal(headers, &rec.Header); err != nil {
				return nil, s.unavailable("decoding headers", err)
			}
		}
		return rec, nil
	}
	return nil, s.unavailable("acquiring", errors.New("the key changed under every attempt"))
}

// Complete replaces the claim c with rec, kept for ttl. The row's endpoint,
// fingerprint and creation time, which are c's, stay.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	var headers []byte
	if len(rec.Header) > 0 {
		var err error
		if headers, err = json.Marshal(rec.Header); err != nil {
			return fmt.Errorf("encoding headers: %w", err)
		}
	}
	return s.exec(ctx, "completing", s.db.q.complete,
		key[:], c.Token[:], rec.Status, headers, rec.Body, rec.Truncated, micros(ttl))
}

// Release deletes the claim held by token.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	return s.exec(ctx, "releasing", s.db.q.release, key[:], token[:])
}

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	return s.exec(ctx, "renewing", s.db.q.renew, key[:], token[:], micros(lease))
}

// exec runs one of the owner-checked statements: no row means the token
// does not hold the claim.
func (s *Store) exec(ctx context.Context, op, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := s.db.ensure(ctx); err != nil {
		return err
	}
	tag, err := s.db.pool.Exec(ctx, sql, args...)
	switch {
	case err != nil:
		return s.unavailable(op, err)
	case tag.RowsAffected() == 0:
		return store.ErrNotOwner
	}
	return nil
}

// unavailable wraps every database error in store.ErrUnavailable, with a
// hint when the table is missing because create_table is off.
func (s *Store) unavailable(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w: %s: table %s does not exist; create it (see DDL) or turn create_table on: %w",
			store.ErrUnavailable, op, s.db.qualified, err)
	}
	return store.Unavailable(op, err)
}

// micros rounds d up to whole microseconds, PostgreSQL's resolution, at
// least one: rounding down could end a lease early.
func micros(d time.Duration) int64 {
	return max(1, int64((d+time.Microsecond-1)/time.Microsecond))
}
