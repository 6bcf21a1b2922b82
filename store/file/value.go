package file

import (
	"bytes"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// records is the one bucket, keyed by store.Key. A value is a completed
// record in the shared codec, whose head gives the sweeper its expiry.
var records = []byte("records")

// now is replaced by tests.
var now = time.Now

// live reports whether v holds a record whose TTL has not passed; no
// record, or a claim, has no expiry and is never live.
func live(v []byte, t time.Time) bool { return t.Before(store.Encoded(v).ExpiresAt()) }

// liveRecord returns the live record of key, copied out of the
// transaction's memory, or nil.
func liveRecord(b *bolt.Bucket, key store.Key, t time.Time) (*store.Record, error) {
	v := b.Get(key[:])
	if !live(v, t) {
		return nil, nil
	}
	rec, err := store.DecodeRecord(bytes.Clone(v))
	if err != nil {
		return nil, fmt.Errorf("decoding record: %w", err)
	}
	return rec, nil
}
