package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// acquireAttempts bounds the reruns of the Acquire statement, needed when
// the key changed between the statement's snapshot and its insert.
const acquireAttempts = 5

// A completed record's ExpiresAt, until which the local tier keeps it, is
// by this instance's clock: the time to live is added to when the
// statement was sent, so the record expires here no later than there,
// however far apart the clocks are.

// Acquire claims key for c, or returns its live record, in one statement;
// a second takes over an expired row. The local tier serves and keeps
// completed records.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (store.Acquired, error) {
	var version uint64
	if s.tier != nil {
		if blob := s.tier.Get(key); blob != nil {
			rec, err := store.DecodeRecord(blob)
			if err != nil {
				return store.Acquired{}, store.Unavailable("decoding record", err)
			}
			return store.Acquired{Record: rec}, nil
		}
		version = s.tier.Version()
	}
	caller := ctx
	ctx = s.db.deadlines.bound(ctx)
	if err := s.db.ensure(ctx); err != nil {
		return store.Acquired{}, err
	}
	args := claimArgs(key, c)
	for range acquireAttempts {
		r := &row{args: args}
		r.dests(&r.won, &r.ttl)
		start := time.Now()
		found, err := s.db.query(ctx, caller, s.db.q.acquire, r, 7)
		switch {
		case err != nil:
			return store.Acquired{}, s.unavailable("acquiring", err)
		case !found:
			continue
		case r.won:
			return store.Acquired{}, nil
		case r.ttl > 0:
			return s.found(key, r, start, version, false)
		}
		got, done, err := s.takeOver(ctx, key, r.args[:], version)
		if done || err != nil {
			return got, err
		}
	}
	return store.Acquired{}, s.unavailable("acquiring", errors.New("the key changed under every attempt"))
}

// takeOver replaces key's expired row, unless it is no longer expired or
// gone (done false: Acquire looks again). What became of it is what the
// statement replaced: a dead claim, which the claim took over or, with
// KeepUnknown, made its unknown outcome, or an expired record.
func (s *Store) takeOver(ctx context.Context, key store.Key, args []any, version uint64) (got store.Acquired, done bool, err error) {
	r := new(row)
	var tookOver bool
	start := time.Now()
	// The first column is the notification of waiters, if any: nothing
	// to read.
	err = onConn(ctx, s.db.pool, s.db.lost, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, s.db.q.takeover, args...).Scan(r.dests(nil, &tookOver, &r.ttl)...)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Acquired{}, false, nil
	case err != nil:
		return store.Acquired{}, false, s.unavailable("taking over", err)
	case r.rec.State == store.InProgress: // the claim holds the key
		return store.Acquired{TookOver: tookOver}, true, nil
	}
	got, err = s.found(key, r, start, version, true)
	return got, true, err
}

// found returns the live record scanned into r by a statement sent at
// start, keeping it in the tier if completed.
func (s *Store) found(key store.Key, r *row, start time.Time, version uint64, tookOver bool) (store.Acquired, error) {
	rec, err := r.record(start.Add(time.Duration(r.ttl)))
	if err != nil {
		return store.Acquired{}, s.unavailable("acquiring", err)
	}
	if rec.State == store.Completed && s.tier != nil {
		s.tier.Put(key, store.AppendRecord(nil, rec), version)
	}
	return store.Acquired{Record: rec, TookOver: tookOver}, nil
}

// claimArgs are the parameters of takeover, in order; acquire takes all
// but the last.
func claimArgs(key store.Key, c *store.Claim) [8]any {
	return [8]any{key[:], c.Token[:], bytesOf(c.Endpoint), c.Fingerprint[:], micros(c.Lease), c.CreatedAt.UnixMicro(),
		micros(keptFor(c)), c.KeepUnknown}
}

// keptFor is how long c's row is kept past its lease, so that a retry
// after a dead owner's lease is told it takes the claim over: the TTL its
// record would have.
func keptFor(c *store.Claim) time.Duration {
	if c.TTL <= 0 {
		return defaultKeep
	}
	return c.TTL
}

// defaultKeep stands for a TTL the caller left out: the handler's default
// ttl.
const defaultKeep = 24 * time.Hour

// Complete replaces the claim c with resp, kept for ttl.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	var headers []byte // NULL without headers
	if len(resp.Header) > 0 {
		buf := headerBuffers.Get().(*[]byte)
		defer func() {
			if cap(*buf) <= 16<<10 { // larger buffers are not pooled
				headerBuffers.Put(buf)
			}
		}()
		*buf = store.AppendHeader((*buf)[:0], resp.Header)
		headers = *buf
	}
	var version uint64
	var start time.Time
	if s.tier != nil {
		version, start = s.tier.Version(), time.Now()
	}
	err := s.exec(ctx, "completing", s.db.q.complete,
		key[:], c.Token[:], resp.Status, headers, resp.Body, resp.Truncated, resp.OutcomeUnknown, resp.Sealed, micros(ttl))
	if err == nil && s.tier != nil {
		s.tier.Put(key, store.AppendCompleted(nil, c, resp, start.Add(ttl)), version)
	}
	return err
}

// headerBuffers holds the buffers Complete encodes headers into; pgx copies
// them into its own buffer before Exec returns.
var headerBuffers = sync.Pool{New: func() any { return new([]byte) }}

// Release deletes the claim held by token. Finding none is no answer
// while the session of a lost connection, which may yet write it, is still
// on the server (lost.go); it looks for them first, so that one gone by
// then has committed before the delete's snapshot.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	running, err := s.db.lost.running(s.db.deadlines.bound(ctx), s.db.pool)
	if err != nil {
		return s.unavailable("releasing", err)
	}
	err = s.exec(ctx, "releasing", s.db.q.release, key[:], token[:])
	if running && errors.Is(err, store.ErrNotOwner) {
		return store.Unavailable("releasing", errLostSessionRuns)
	}
	return err
}

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	return s.exec(ctx, "renewing", s.db.q.renew, key[:], token[:], micros(lease))
}

// exec runs an owner-checked statement: no row means ErrNotOwner.
func (s *Store) exec(ctx context.Context, op, sql string, args ...any) error {
	ok, err := s.affected(ctx, op, sql, args...)
	if err == nil && !ok {
		return store.ErrNotOwner
	}
	return err
}

// affected runs a statement once the table exists, and reports whether it
// affected a row.
func (s *Store) affected(ctx context.Context, op, sql string, args ...any) (bool, error) {
	caller := ctx
	ctx = s.db.deadlines.bound(ctx)
	if err := s.db.ensure(ctx); err != nil {
		return false, err
	}
	ok, err := s.db.exec(ctx, caller, sql, args)
	if err != nil {
		return false, s.unavailable(op, err)
	}
	return ok, nil
}

// unavailable wraps a database error in store.ErrUnavailable, saying what
// becomes of a missing table: created again with create_table on, else
// the operator's to create.
func (s *Store) unavailable(op string, err error) error {
	switch {
	case !s.db.dropped(err):
		return store.Unavailable(op, err)
	case s.db.create:
		return fmt.Errorf("%w: %s: table %s does not exist (dropped?); the next call creates it again: %w",
			store.ErrUnavailable, op, s.db.qualified, err)
	}
	return fmt.Errorf("%w: %s: table %s does not exist; create it (see DDL) or turn create_table on: %w",
		store.ErrUnavailable, op, s.db.qualified, err)
}

// bytesOf is s as a bytea argument, without a copy: pgx only reads it
// before the call returns. An empty string is an empty bytea, not NULL.
func bytesOf(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// micros rounds d up to whole microseconds, PostgreSQL's resolution, at
// least one: rounding down could end a lease early.
func micros(d time.Duration) int64 {
	return max(1, int64((d+time.Microsecond-1)/time.Microsecond))
}

var _ store.Store = (*Store)(nil)
