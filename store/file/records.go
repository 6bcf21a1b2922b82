package file

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// A stored value is the record's expiry, Unix nanoseconds big endian (the
// lease end while in progress, the TTL end once completed), followed by the
// record in the shared codec. The fixed prefix lets the sweeper read a
// record's life, and the codec's head its owner, without decoding it.
const expiryLen = 8

// now is replaced by tests.
var now = time.Now

func expiresAt(v []byte) int64 { return int64(binary.BigEndian.Uint64(v)) }

// live reports whether v holds a record whose lease or TTL has not passed.
// A value too short to hold an expiry is treated as absent.
func live(v []byte, t time.Time) bool {
	return len(v) >= expiryLen && t.UnixNano() < expiresAt(v)
}

// record is the encoded record of v, empty (no record) if v is too short.
func record(v []byte) store.Encoded {
	if len(v) < expiryLen {
		return nil
	}
	return v[expiryLen:]
}

// ownedBy reports whether v is a live in-progress claim held by token.
func ownedBy(v []byte, token store.Token, t time.Time) bool {
	return live(v, t) && record(v).ClaimedBy(token)
}

// expiry starts a value: the big-endian Unix nanoseconds at which it
// expires, to which the record's encoding is appended.
func expiry(at time.Time) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, expiryLen), uint64(at.UnixNano()))
}

// deadClaim reports whether v is an in-progress claim whose lease has
// passed: its owner died or stalled, and claiming the key takes it over.
func deadClaim(v []byte, t time.Time) bool {
	return !live(v, t) && record(v).State() == store.InProgress
}

// liveRecord returns the live record of key, copied out of the
// transaction's memory, or nil.
func liveRecord(b *bolt.Bucket, key store.Key, t time.Time) (*store.Record, error) {
	v := b.Get(key[:])
	if !live(v, t) {
		return nil, nil
	}
	rec, err := store.DecodeRecord(bytes.Clone(record(v)))
	if err != nil {
		return nil, fmt.Errorf("decoding record: %w", err)
	}
	return rec, nil
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
