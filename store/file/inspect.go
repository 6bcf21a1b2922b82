package file

import (
	"bytes"
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultName names the directory of the database file, which alone
// decides what records a store sees, as an absolute path without symbolic
// links, as in "file /var/lib/caddy/idempotency".
func defaultName(dir string) string { return "file " + dir }

// Lookup reads key's live record and its expiry in a read-only
// transaction.
func (s *Store) Lookup(ctx context.Context, key store.Key) (*store.Record, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	var rec *store.Record
	var expires time.Time
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		b := tx.Bucket(records)
		if rec, err = liveRecord(b, key, now()); err != nil || rec == nil {
			return err
		}
		expires = time.Unix(0, expiresAt(b.Get(key[:])))
		return nil
	})
	if err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	return rec, expires, nil
}

// Delete removes key's record, whoever owns it, expired or not, and
// reports whether it was live.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, store.Unavailable("deleting", err)
	}
	var found bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		v := b.Get(key[:])
		if v == nil {
			return nil
		}
		found = live(v, now())
		return b.Delete(key[:])
	})
	if err != nil {
		return false, store.Unavailable("deleting", err)
	}
	return found, nil
}

// InFlight walks the whole bucket with a cursor in one read-only
// transaction, which writers do not wait for, reading only the fixed head
// of each value and decoding the claims it keeps.
func (s *Store) InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	if limit <= 0 {
		return nil, nil
	}
	var out []store.Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		t := now()
		cutoff := t.Add(-olderThan)
		c := tx.Bucket(records).Cursor()
		scanned := 0
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if scanned++; scanned%4096 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			head := encoded(v)
			if len(k) != len(store.Key{}) || head.State() != store.InProgress || !live(v, t) || head.CreatedAt().After(cutoff) {
				continue
			}
			rec, err := store.DecodeRecord(bytes.Clone(head))
			if err != nil {
				continue // not a record this store wrote: leave it to Lookup to report
			}
			e := store.Entry{Summary: store.Summarize(rec), ExpiresAt: time.Unix(0, expiresAt(v))}
			copy(e.Key[:], k)
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	return store.SortEntries(out, limit), nil
}

var _ store.Inspector = (*Store)(nil)
