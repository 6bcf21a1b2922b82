package idempotency

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// sealing (encryption_keys) wraps the configured store, sealing a completed
// response's headers and body (keyring.go) before the store sees them and
// opening them for replay; state, status, times, endpoint and fingerprint
// stay clear for inspect, stuck and purge. It wraps every store, with or
// without keys, so that a sealed record no key opens is refused: never
// replayed as ciphertext, never run again.
type sealing struct {
	store.Store
	keys *keyring // nil: no encryption_keys, nothing is sealed
}

func sealStore(s store.Store, keys *keyring) *sealing {
	return &sealing{Store: s, keys: keys}
}

// unreadableRecord is Acquire's error for a sealed record to replay that
// does not open.
type unreadableRecord struct {
	reason string // unknown_key, authentication or malformed: a metric label
	keyID  string // the id the record names; empty if malformed
}

func (e *unreadableRecord) Error() string {
	switch e.reason {
	case "unknown_key":
		return "opening the stored response: sealed with key id " + e.keyID + ", which no configured key has"
	case "authentication":
		return "opening the stored response: authentication failed with key id " + e.keyID + " (the record was changed, or copied from another key)"
	}
	return "opening the stored response: malformed sealed record"
}

func (s *sealing) Acquire(ctx context.Context, k store.Key, c *store.Claim) (store.Acquired, error) {
	got, err := s.Store.Acquire(ctx, k, c)
	rec := got.Record
	if err != nil || rec == nil || !rec.Sealed {
		return got, err
	}
	if !boundTo(rec, c) {
		// refused with 422 whatever it holds: no need to open it
		out := *rec
		out.Header, out.Body = nil, nil
		got.Record = &out
		return got, nil
	}
	got.Record, err = s.keys.open(k, rec)
	return got, err
}

func (s *sealing) Complete(ctx context.Context, k store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	if s.keys == nil || resp.Truncated || resp.OutcomeUnknown {
		return s.Store.Complete(ctx, k, c, resp, ttl)
	}
	sealed, err := s.keys.seal(k, resp)
	if err != nil {
		return err
	}
	return s.Store.Complete(ctx, k, c, sealed, ttl)
}

// Interface guard
var _ store.Store = (*sealing)(nil)
