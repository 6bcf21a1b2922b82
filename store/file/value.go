package file

import (
	"time"

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
