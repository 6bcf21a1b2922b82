package file

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultName names the resolved directory of the database file.
func defaultName(dir string) string { return "file " + dir }

// Lookup returns key's claim from memory, or else its live record from the
// file, and its expiry.
func (s *Store) Lookup(ctx context.Context, key store.Key) (*store.Record, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	db, err := s.open("looking up")
	if err != nil {
		return nil, time.Time{}, err
	}
	blob, exp, ok, err := db.claims.lookup(key, now())
	if err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	if ok {
		rec, err := store.DecodeRecord(blob)
		if err != nil {
			return nil, time.Time{}, err
		}
		return rec, time.Unix(0, exp), nil
	}
	rec, err := db.onDisk(key)
	if err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	if rec == nil {
		return nil, time.Time{}, nil
	}
	return rec, rec.ExpiresAt, nil
}

// Delete removes key's claim and its record in the file, whoever owns
// them, and reports whether either was live. The file is written after the
// claim is gone, so that a completion committed meanwhile goes too.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, store.Unavailable("deleting", err)
	}
	db, err := s.open("deleting")
	if err != nil {
		return false, err
	}
	found, err := db.claims.remove(key, now())
	if err != nil {
		return false, store.Unavailable("deleting", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		v := b.Get(key[:])
		if v == nil {
			return nil
		}
		found = live(v, now()) || found
		return b.Delete(key[:])
	})
	if err != nil {
		return false, store.Unavailable("deleting", err)
	}
	return found, nil
}

// InFlight lists the claims in memory, where every claim of the file is.
func (s *Store) InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	if limit <= 0 {
		return nil, nil
	}
	db, err := s.open("listing claims")
	if err != nil {
		return nil, err
	}
	t := now()
	inMemory, err := db.claims.list(t, t.Add(-olderThan))
	if err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	out := make([]store.Entry, 0, len(inMemory))
	for k, e := range inMemory {
		rec, err := store.DecodeRecord(e.blob)
		if err != nil {
			return nil, err
		}
		out = append(out, store.Entry{Key: k, Summary: store.Summarize(rec), ExpiresAt: time.Unix(0, e.expires)})
	}
	return store.SortEntries(out, limit), nil
}

var _ store.Inspector = (*Store)(nil)
