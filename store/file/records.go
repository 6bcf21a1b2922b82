package file

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// ownedBy reports whether v is a live in-progress claim held by token.
func ownedBy(v []byte, token store.Token, t time.Time) bool {
	return live(v, t) && encoded(v).ClaimedBy(token)
}

// deadClaim reports whether v is an in-progress claim whose lease has
// passed: its owner died or stalled, and claiming the key takes it over.
func deadClaim(v []byte, t time.Time) bool {
	return !live(v, t) && encoded(v).State() == store.InProgress
}

// Acquire claims key for c unless a live record exists. A read-only
// transaction answers replays and conflicts without taking the single
// writer lock or syncing the file; only a claim writes, and it checks again
// under the lock.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (*store.Record, error) {
	c.TookOver = false
	if err := ctx.Err(); err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	var rec *store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		rec, err = liveRecord(tx.Bucket(records), key, now())
		return err
	})
	if err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	if rec != nil {
		return rec, nil
	}
	var (
		tookOver bool
		created  time.Time
	)
	err = s.db.writes.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		t := now()
		var err error
		if rec, err = liveRecord(b, key, t); err != nil || rec != nil {
			return err
		}
		tookOver, created = deadClaim(b.Get(key[:]), t), t
		return b.Put(key[:], store.AppendClaim(expiry(t.Add(c.Lease)), c, t))
	})
	if err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	if rec == nil {
		c.TookOver, c.CreatedAt = tookOver, created
	}
	return rec, nil
}

// Complete replaces the claim c with rec, kept for ttl, under c's binding.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	return s.update(ctx, "completing", key, c.Token, func(b *bolt.Bucket, _ []byte, t time.Time) error {
		return b.Put(key[:], store.AppendCompleted(expiry(t.Add(ttl)), c, rec))
	})
}

// Release deletes the claim held by token.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	return s.update(ctx, "releasing", key, token, func(b *bolt.Bucket, _ []byte, _ time.Time) error {
		return b.Delete(key[:])
	})
}

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	return s.update(ctx, "renewing", key, token, func(b *bolt.Bucket, v []byte, t time.Time) error {
		// v belongs to bbolt's memory map: write a copy.
		nv := bytes.Clone(v)
		binary.BigEndian.PutUint64(nv, uint64(t.Add(lease).UnixNano()))
		return b.Put(key[:], nv)
	})
}

// update runs fn in a write transaction if token holds key's claim, and
// returns store.ErrNotOwner otherwise.
func (s *Store) update(ctx context.Context, op string, key store.Key, token store.Token,
	fn func(b *bolt.Bucket, v []byte, t time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable(op, err)
	}
	err := s.db.writes.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		v, t := b.Get(key[:]), now()
		if !ownedBy(v, token, t) {
			return store.ErrNotOwner
		}
		return fn(b, v, t)
	})
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		return store.Unavailable(op, err)
	}
	return err
}

var _ store.Store = (*Store)(nil)
