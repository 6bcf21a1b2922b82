// Package store defines what the idempotency handler needs from a backend:
// an atomic claim of a key, and the completion or release of that claim by
// its owner. Backends live in subpackages and register themselves as Caddy
// modules in the http.idempotency.stores namespace.
//
// Every backend package is laid out alike: <name>.go is the module (its
// config, Provision, Validate, Cleanup), caddyfile.go its Caddyfile
// syntax, records.go the Store methods, inspect.go the Inspector methods
// and its default name, and each piece of machinery of its own has a file
// named for it (the file store's database, the SQL of PostgreSQL, the
// Redis key names). What several backends share lives beside them:
// internal/table, the bounded table of encoded records that the memory
// store and the local tier are built on, and tier, the local tier of the
// Redis and PostgreSQL stores. Here, store.go is the contract, codec.go
// the record encoding that the memory, file and Redis stores share,
// inspect.go the Inspector, and registry.go the registry through which the
// admin API reaches provisioned stores.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Key identifies one idempotent operation in a store: the SHA-256 of the
// request's scope and the client's Idempotency-Key. Its fixed size keeps
// stored keys short whatever the client sends, and hides the raw key.
type Key [32]byte

// NewKey derives the store key for a client key within a scope (for example
// the authenticated user). The scope is length-prefixed so that no pair of
// scope and key can collide with another pair.
func NewKey(scope, clientKey string) Key {
	h := sha256.New()
	var n [8]byte
	l := uint64(len(scope))
	for i := range n {
		n[i] = byte(l >> (8 * i))
	}
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(clientKey))
	var k Key
	h.Sum(k[:0])
	return k
}

// String returns the key as 64 lowercase hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Token identifies the owner of a claim. Only the holder of the token that
// made a claim may renew, complete or release it, so a request whose lease
// expired can never overwrite the work of the request that took over.
type Token [16]byte

// Fingerprint is the SHA-256 of what the request carries (its query and
// body); a retry must carry the same.
type Fingerprint [32]byte

// State is the life-cycle stage of a record.
type State uint8

const (
	// InProgress means a request holds the claim and is running.
	InProgress State = 1
	// Completed means the response is stored and is replayed to retries.
	Completed State = 2
)

func (s State) String() string {
	switch s {
	case InProgress:
		return "in_progress"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// Response is the answer that Complete keeps for a claim, and that a
// completed record replays.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Truncated marks a request that ran but whose response cannot be
	// replayed: it outgrew the handler's max_response_body, or broke off.
	// Status is the one sent; Header and Body are empty.
	Truncated bool
	// OutcomeUnknown marks a request that was sent to the upstream but
	// never answered (the connection broke, a timeout, the work was
	// cancelled): it may have been carried out, so it is not run again,
	// and there is nothing to replay. Status, Header and Body are empty.
	OutcomeUnknown bool
	// Sealed marks a response that the handler encrypted (encryption_keys):
	// Header is empty and Body holds the sealed headers and body, which
	// stores keep as they keep any body.
	Sealed bool
}

// Record is what a store keeps for one key: the claim's binding and, once
// completed, its response.
type Record struct {
	State State
	// Token is the owner of the claim.
	Token Token
	// Endpoint is what the key was first used for (the handler binds it to
	// method, host and path by default).
	Endpoint string
	// Fingerprint of the first request's payload.
	Fingerprint Fingerprint
	// CreatedAt is when the key was claimed (Claim.CreatedAt).
	CreatedAt time.Time
	// Response is what a completed record replays.
	Response
	// ExpiresAt is when a completed record expires, by the clock of the
	// instance that completed it or, for a store that keeps expiry itself,
	// that read it; zero for a claim.
	ExpiresAt time.Time
}

// Claim is the request that asks for a key. A store reads it and never
// writes it.
type Claim struct {
	Token       Token
	Endpoint    string
	Fingerprint Fingerprint
	// CreatedAt is when the handler made the claim, before Acquire was
	// sent; the record keeps it.
	CreatedAt time.Time
	// Lease is how long the claim holds without renewal: if its owner
	// dies, another request may take the key over once it has passed.
	Lease time.Duration
}

// Acquired is what became of a claim: either it holds the key (Record is
// nil), or the key has a live Record, which the claim left as it was.
type Acquired struct {
	Record *Record
	// TookOver is set when the claim replaced an in-progress claim whose
	// lease had passed (its owner died or stalled). Stores that cannot tell
	// (Redis expires claims by itself) leave it false.
	TookOver bool
}

// Store is an idempotency backend. Every method is safe for concurrent use,
// and every method that takes a token acts only if that token still owns
// the key's claim, atomically with the check.
type Store interface {
	// Acquire claims key for c if no live record exists (none, or an
	// in-progress claim whose lease has passed, or a completed record past
	// its TTL). Otherwise it returns the live record, unchanged.
	Acquire(ctx context.Context, key Key, c *Claim) (Acquired, error)

	// Complete replaces the claim c, as Acquire recorded it, with resp,
	// kept for ttl. The record keeps the claim's binding (its Endpoint,
	// Fingerprint and CreatedAt). ErrNotOwner if c.Token no longer holds
	// the claim.
	Complete(ctx context.Context, key Key, c *Claim, resp *Response, ttl time.Duration) error

	// Release deletes the claim held by token, so that a retry runs anew.
	// ErrNotOwner if token no longer holds the claim.
	Release(ctx context.Context, key Key, token Token) error

	// Renew extends the lease of the claim held by token to lease from
	// now. ErrNotOwner if token no longer holds the claim.
	Renew(ctx context.Context, key Key, token Token, lease time.Duration) error
}

var (
	// ErrNotOwner is returned when the caller's claim expired and was taken
	// over, completed or released by someone else.
	ErrNotOwner = errors.New("claim is not held by this owner")

	// ErrUnavailable wraps every failure of the backend itself (network,
	// timeout, closed store); the handler answers it per on_store_error.
	ErrUnavailable = errors.New("idempotency store unavailable")
)

// Unavailable wraps err, a failure of the backend while op ("acquiring",
// "renewing", ...) was under way, in ErrUnavailable.
func Unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}
