package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// onDisk reads key's live record, copied out of the file, in a read-only
// transaction: no writer lock, no sync.
func (d *database) onDisk(key store.Key) (rec *store.Record, err error) {
	err = d.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(records).Get(key[:])
		if !live(v, now()) {
			return nil
		}
		if rec, err = store.DecodeRecord(bytes.Clone(v)); err != nil {
			return fmt.Errorf("decoding record: %w", err)
		}
		return nil
	})
	return rec, err
}

// Acquire claims key for c, in memory, unless a live record exists in the
// file or in memory. The file is read again if a completion raced (claims).
// With c.KeepUnknown, a dead owner's claim becomes its request's unknown
// outcome instead (dead.go), at the cost of a completion's synced write.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (store.Acquired, error) {
	db, err := s.open("acquiring")
	if err != nil {
		return store.Acquired{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return store.Acquired{}, store.Unavailable("acquiring", err)
		}
		gen := db.claims.generation(key)
		rec, err := db.onDisk(key)
		if err != nil {
			return store.Acquired{}, store.Unavailable("acquiring", err)
		}
		if rec != nil {
			return store.Acquired{Record: rec}, nil
		}
		r, err := db.claims.take(key, c, now(), gen)
		if err != nil {
			return store.Acquired{}, store.Unavailable("acquiring", err)
		}
		switch {
		case r.stale:
			continue
		case r.holder != nil:
			rec, err := store.DecodeRecord(r.holder)
			if err != nil {
				return store.Acquired{}, err
			}
			return store.Acquired{Record: rec}, nil
		case r.heir != nil:
			got, err := db.keepUnknown(key, c, r.heir)
			if errors.Is(err, store.ErrNotOwner) {
				continue // purged meanwhile: the key is free
			}
			return got, unlessNotOwner("acquiring", err)
		}
		return store.Acquired{TookOver: r.tookOver}, nil
	}
}

// Complete writes resp, kept for ttl, to the file if c still holds the
// key, then drops the claim. Concurrent completions share one commit.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("completing", err)
	}
	db, err := s.open("completing")
	if err != nil {
		return err
	}
	var pinned *held
	err = db.writes.update(func(tx *bolt.Tx) error {
		t := now()
		var err error
		if pinned, err = db.claims.pin(key, c.Token, t); err != nil {
			return err
		}
		// Encoded here, so that the wait for the writer lock does not
		// shorten the TTL.
		return tx.Bucket(records).Put(key[:], store.AppendCompleted(nil, c, resp, t.Add(ttl)))
	})
	if pinned != nil {
		db.claims.settle(key, pinned, err == nil)
	}
	return unlessNotOwner("completing", err)
}

// Release deletes the claim held by token, in memory only.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("releasing", err)
	}
	db, err := s.open("releasing")
	if err != nil {
		return err
	}
	return unlessNotOwner("releasing", db.claims.release(key, token))
}

// Renew sets the lease of the claim held by token, in memory only.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return store.Unavailable("renewing", err)
	}
	db, err := s.open("renewing")
	if err != nil {
		return err
	}
	return unlessNotOwner("renewing", db.claims.renew(key, token, lease, now()))
}

// unlessNotOwner wraps err in store.ErrUnavailable unless it is
// store.ErrNotOwner.
func unlessNotOwner(op string, err error) error {
	if err == nil || errors.Is(err, store.ErrNotOwner) {
		return err
	}
	return store.Unavailable(op, err)
}

var _ store.Store = (*Store)(nil)
