package file

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// deadClaim reports whether v is an in-progress claim whose lease has
// passed. Claims are no longer written to the file; this one was left by
// an older version of this store, whose process died while it held it.
func deadClaim(v []byte, t time.Time) bool {
	return !live(v, t) && encoded(v).State() == store.InProgress
}

// onDisk reads key's live record from the file in a read-only
// transaction, which neither takes the writer lock nor syncs, and reports
// whether the file holds a dead claim of key instead.
func (d *database) onDisk(key store.Key) (rec *store.Record, dead bool, err error) {
	err = d.View(func(tx *bolt.Tx) error {
		b, t := tx.Bucket(records), now()
		if rec, err = liveRecord(b, key, t); err != nil || rec != nil {
			return err
		}
		dead = deadClaim(b.Get(key[:]), t)
		return nil
	})
	return rec, dead, err
}

// Acquire claims key for c unless a live record exists: a completed record
// in the file (or a claim that an older version left there, until its
// lease passes), or a claim in memory. The claim itself is made in memory
// and costs no sync.
//
// An owner commits its completion before it drops its claim, and counts it
// as it does (claims.settle), so the claim is made only if no completion of
// the key's shard was counted since before the file was read: one that
// was is in the file, and the file is read again.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (*store.Record, error) {
	c.TookOver = false
	for {
		if err := ctx.Err(); err != nil {
			return nil, store.Unavailable("acquiring", err)
		}
		gen := s.db.claims.generation(key)
		rec, dead, err := s.db.onDisk(key)
		if err != nil {
			return nil, store.Unavailable("acquiring", err)
		}
		if rec != nil {
			return rec, nil
		}
		t := now()
		holder, tookOver, stale, err := s.db.claims.take(key, c, t, dead, gen)
		if err != nil {
			return nil, store.Unavailable("acquiring", err)
		}
		if stale {
			continue
		}
		if holder != nil {
			return store.DecodeRecord(holder)
		}
		c.TookOver, c.CreatedAt = tookOver, t
		return nil, nil
	}
}

// Complete writes rec, kept for ttl under c's binding, to the file if c
// still holds the key, then drops the claim. Concurrent completions share
// one commit (group commit).
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("completing", err)
	}
	// Encoded before the transaction, which holds the single writer lock;
	// the expiry is set inside it.
	v := store.AppendCompleted(expiry(time.Time{}), c, rec)
	var pinned *held
	err := s.db.writes.update(func(tx *bolt.Tx) error {
		t := now()
		var err error
		if pinned, err = s.db.claims.pin(key, c.Token, t); err != nil {
			return err
		}
		binary.BigEndian.PutUint64(v, uint64(t.Add(ttl).UnixNano()))
		return tx.Bucket(records).Put(key[:], v)
	})
	if pinned != nil {
		s.db.claims.settle(key, pinned, err == nil)
	}
	return unlessNotOwner("completing", err)
}

// Release deletes the claim held by token. It writes nothing to the file.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("releasing", err)
	}
	return unlessNotOwner("releasing", s.db.claims.release(key, token, now()))
}

// Renew sets the lease of the claim held by token to lease from now. It
// writes nothing to the file.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("renewing", err)
	}
	return unlessNotOwner("renewing", s.db.claims.renew(key, token, lease, now()))
}

// unlessNotOwner wraps err, the failure of op, in store.ErrUnavailable,
// unless it is store.ErrNotOwner.
func unlessNotOwner(op string, err error) error {
	if err == nil || errors.Is(err, store.ErrNotOwner) {
		return err
	}
	return store.Unavailable(op, err)
}

var _ store.Store = (*Store)(nil)
