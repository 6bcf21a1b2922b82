package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// acquireAttempts bounds the reruns of the Acquire statement, needed when
// the key changed between the statement's snapshot and its insert.
const acquireAttempts = 5

// A completed record's ExpiresAt, until which the local tier keeps it, is
// by this instance's clock, never compared with the database's: the ttl
// (or the time to live the database computed) is added to when the
// statement was sent, before it started there, so the record expires here
// no later than there, however far apart the clocks are.

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
	ctx = s.db.deadlines.bound(ctx)
	if err := s.db.ensure(ctx); err != nil {
		return store.Acquired{}, err
	}
	for range acquireAttempts {
		r := new(row)
		start := time.Now()
		err := s.db.pool.QueryRow(ctx, s.db.q.acquire, key[:], c.Token[:], bytesOf(c.Endpoint), c.Fingerprint[:], micros(c.Lease), c.CreatedAt.UnixMicro()).
			Scan(r.acquired()...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return store.Acquired{}, s.unavailable("acquiring", err)
		case r.won:
			return store.Acquired{}, nil
		case r.live():
			rec, err := r.record()
			if err != nil {
				return store.Acquired{}, s.unavailable("acquiring", err)
			}
			if rec.State == store.Completed {
				rec.ExpiresAt = start.Add(time.Duration(r.ttl))
				if s.tier != nil {
					s.tier.Put(key, store.AppendRecord(nil, rec), version)
				}
			}
			return store.Acquired{Record: rec}, nil
		}
		won, err := s.takeOver(ctx, key, c)
		if err != nil {
			return store.Acquired{}, err
		}
		if won {
			// A claim was taken over if the snapshot's row was in
			// progress. A row that replaced it since would have made the
			// update fail unless expired in turn: the claim is atomic.
			return store.Acquired{TookOver: r.rec.State == store.InProgress}, nil
		}
	}
	return store.Acquired{}, s.unavailable("acquiring", errors.New("the key changed under every attempt"))
}

// takeOver replaces the key's expired row with c's claim, or reports false
// when the row is no longer expired or is gone.
func (s *Store) takeOver(ctx context.Context, key store.Key, c *store.Claim) (bool, error) {
	tag, err := s.db.pool.Exec(ctx, s.db.q.takeover, key[:], c.Token[:], bytesOf(c.Endpoint), c.Fingerprint[:], micros(c.Lease), c.CreatedAt.UnixMicro())
	if err != nil {
		return false, s.unavailable("taking over", err)
	}
	return tag.RowsAffected() > 0, nil
}

// Complete replaces the claim c with resp, kept for ttl.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	var headers []byte // NULL without headers
	if len(resp.Header) > 0 {
		buf := headerBuffers.Get().(*[]byte)
		defer putHeaderBuffer(buf)
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

const maxHeaderBuffer = 16 << 10 // larger buffers are not pooled

func putHeaderBuffer(buf *[]byte) {
	if cap(*buf) <= maxHeaderBuffer {
		headerBuffers.Put(buf)
	}
}

// Release deletes the claim held by token.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	return s.exec(ctx, "releasing", s.db.q.release, key[:], token[:])
}

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	return s.exec(ctx, "renewing", s.db.q.renew, key[:], token[:], micros(lease))
}

// exec runs an owner-checked statement: no row means ErrNotOwner.
func (s *Store) exec(ctx context.Context, op, sql string, args ...any) error {
	ctx = s.db.deadlines.bound(ctx)
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

// unavailable wraps a database error in store.ErrUnavailable, with a hint
// when the table is missing.
func (s *Store) unavailable(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w: %s: table %s does not exist; create it (see DDL) or turn create_table on: %w",
			store.ErrUnavailable, op, s.db.qualified, err)
	}
	return store.Unavailable(op, err)
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
