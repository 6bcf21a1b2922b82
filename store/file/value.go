package file

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// records is the one bucket, keyed by the 32-byte store.Key.
var records = []byte("records")

// A stored value is the record's expiry, Unix nanoseconds big endian (the
// TTL end of a completed record; the lease end of a claim, which only
// versions that kept claims in the file wrote), followed by the record in
// the shared codec. The fixed prefix lets the sweeper read a
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

// encoded is the record in v, in the shared codec; empty (no record) if v
// is too short to hold one.
func encoded(v []byte) store.Encoded {
	if len(v) < expiryLen {
		return nil
	}
	return v[expiryLen:]
}

// expiry starts a value: the big-endian Unix nanoseconds at which it
// expires, to which the record's encoding is appended.
func expiry(at time.Time) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, expiryLen), uint64(at.UnixNano()))
}

// liveRecord returns the live record of key, copied out of the
// transaction's memory, or nil.
func liveRecord(b *bolt.Bucket, key store.Key, t time.Time) (*store.Record, error) {
	v := b.Get(key[:])
	if !live(v, t) {
		return nil, nil
	}
	rec, err := store.DecodeRecord(bytes.Clone(encoded(v)))
	if err != nil {
		return nil, fmt.Errorf("decoding record: %w", err)
	}
	return rec, nil
}
