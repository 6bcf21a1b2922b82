// Package sealing encrypts the responses a store keeps (encryption_keys):
// Store wraps a store.Store, sealing each response before the store sees it
// and opening it for replay.
package sealing

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Store (encryption_keys) wraps the configured store, sealing a completed
// response's headers and body (keyring.go) before the store sees them and
// opening them for replay; state, status, times, endpoint and fingerprint
// stay clear for inspect, stuck and purge. It wraps every store, with or
// without keys, so that a sealed record no key opens is refused: never
// replayed as ciphertext, never run again. With keys, a response that is
// not sealed is refused too (unless acceptUnsealed): this handler seals
// every response it stores, so an unsealed one was stored without keys, or
// planted by whoever can write to the store.
type Store struct {
	store.Store
	Keys           *Keyring // nil: no encryption_keys, nothing is sealed
	AcceptUnsealed bool     // accept_unsealed: replay them, while migrating
}

// Unreadable is Acquire's error for a record to replay that does not
// open, or that is not sealed although it should be.
type Unreadable struct {
	Reason string // unknown_key, authentication, malformed or unsealed: a metric label
	KeyID  string // the id the record names; empty if malformed
}

func (e *Unreadable) Error() string {
	switch e.Reason {
	case "unknown_key":
		return "opening the stored response: sealed with key id " + e.KeyID + ", which no configured key has"
	case "authentication":
		return "opening the stored response: authentication failed with key id " + e.KeyID + " (the record was changed, or copied from another key)"
	case "unsealed":
		return "the stored response is not sealed, and accept_unsealed is off"
	}
	return "opening the stored response: malformed sealed record"
}

func (s *Store) Acquire(ctx context.Context, k store.Key, c *store.Claim) (store.Acquired, error) {
	got, err := s.Store.Acquire(ctx, k, c)
	rec := got.Record
	if err != nil || rec == nil {
		return got, err
	}
	if !rec.BoundTo(c) {
		// refused with 422 whatever it holds: no need to open it
		if rec.Sealed {
			out := *rec
			out.Header, out.Body = nil, nil
			got.Record = &out
		}
		return got, nil
	}
	if rec.Sealed {
		got.Record, err = s.Keys.open(k, rec)
		return got, err
	}
	if s.Keys != nil && !s.AcceptUnsealed && holdsResponse(rec) {
		return store.Acquired{}, &Unreadable{Reason: "unsealed"}
	}
	return got, nil
}

// holdsResponse reports whether rec is one that Complete seals: a claim
// and the markers (truncated, outcome unknown) hold no response to replay.
func holdsResponse(rec *store.Record) bool {
	return rec.State == store.Completed && !rec.Truncated && !rec.OutcomeUnknown
}

func (s *Store) Complete(ctx context.Context, k store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	if s.Keys == nil || resp.Truncated || resp.OutcomeUnknown {
		return s.Store.Complete(ctx, k, c, resp, ttl)
	}
	sealed, err := s.Keys.seal(k, c, resp)
	if err != nil {
		return err
	}
	return s.Store.Complete(ctx, k, c, sealed, ttl)
}

// Interface guard
var _ store.Store = (*Store)(nil)
