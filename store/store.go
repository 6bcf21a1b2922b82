// Package store defines what the idempotency handler needs from a backend:
// an atomic claim of a key, and the completion or release of that claim by
// its owner. Backends live in subpackages and register themselves as Caddy
// modules in the http.idempotency.stores namespace.
//
// Each backend package has <name>.go (the module), caddyfile.go, records.go
// (the Store methods) and inspect.go (the Inspector and its default name).
// internal/table is the bounded table under the memory store and the local
// tier; tier is the local tier of the Redis and PostgreSQL stores.
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

// NewKey derives the store key for a client key within a scope (such as the
// user), length-prefixed so that no two pairs of scope and key collide.
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

// Token identifies the owner of a claim: only its holder may renew,
// complete or release it, so a request whose lease expired never
// overwrites the work of the request that took over.
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
	// Truncated marks a response that cannot be replayed (it outgrew
	// max_response_body, or broke off): only Status is kept.
	Truncated bool
	// OutcomeUnknown marks a request sent upstream but never answered: it
	// may have been carried out, so it is not run again. Nothing is kept.
	OutcomeUnknown bool
	// Sealed marks a response the handler encrypted: Header is empty and
	// Body holds the sealed headers and body.
	Sealed bool
}

// Record is what a store keeps for one key: the claim's binding and, once
// completed, its response.
type Record struct {
	State       State
	Token       Token       // the owner of the claim
	Endpoint    string      // what the key was first used for
	Fingerprint Fingerprint // of the first request's payload
	CreatedAt   time.Time   // Claim.CreatedAt
	Response
	// ExpiresAt is when a completed record expires, by the clock of the
	// instance that completed it or, for a store that keeps expiry itself,
	// that read it; zero for a claim.
	ExpiresAt time.Time
}

// BoundTo reports whether r was made by a request to the same endpoint
// with the same payload as c's: a retry of it, not another use of its key.
func (r *Record) BoundTo(c *Claim) bool {
	return r.Endpoint == c.Endpoint && r.Fingerprint == c.Fingerprint
}

// Claim is the request that asks for a key. A store never writes it.
type Claim struct {
	Token       Token
	Endpoint    string
	Fingerprint Fingerprint
	CreatedAt   time.Time // when the handler made the claim; the record keeps it
	// Lease is how long the claim holds without renewal: once it has
	// passed, another request may take the key over.
	Lease time.Duration
	// TTL is how long the key's record will be kept. A store that keeps
	// claims across a dead owner (file, Redis, PostgreSQL) keeps a claim
	// whose lease passed for as long again, unless it is taken over, so
	// that a retry within TTL is told it takes a dead owner's claim over
	// (Acquired.TookOver) rather than passing for a new key.
	TTL time.Duration
	// KeepUnknown is on_unknown_outcome keep: a dead owner's claim is not
	// taken over but becomes, atomically, the unknown outcome of its own
	// request: a completed record with OutcomeUnknown, bound as the dead
	// claim was (its Endpoint, Fingerprint and CreatedAt), kept for TTL,
	// under this claim's Token, so that the dead owner, if only slow,
	// finds the key no longer its own (ErrNotOwner). Acquire returns that
	// record, with TookOver set.
	KeepUnknown bool
}

// Acquired is what became of a claim: either it holds the key (Record is
// nil), or the key has a live Record, which the claim left as it was, or,
// with Claim.KeepUnknown, made of a dead owner's claim.
type Acquired struct {
	Record *Record
	// TookOver is set when the key held an in-progress claim whose lease
	// had passed: the claim replaced it or, with Claim.KeepUnknown, it
	// became Record, its request's unknown outcome.
	TookOver bool
}

// Store is an idempotency backend, safe for concurrent use. A method that
// takes a token acts only if it still owns the key's claim, atomically.
type Store interface {
	// Acquire claims key for c unless a live record exists (a claim within
	// its lease, a completed record within its TTL), which it returns unchanged.
	Acquire(ctx context.Context, key Key, c *Claim) (Acquired, error)

	// Complete replaces the claim c with resp, kept for ttl, keeping the
	// claim's Endpoint, Fingerprint and CreatedAt. ErrNotOwner if c.Token
	// no longer holds the claim.
	Complete(ctx context.Context, key Key, c *Claim, resp *Response, ttl time.Duration) error

	// Release deletes the claim held by token, so that a retry runs anew,
	// whether or not its lease has passed: until a takeover, its owner
	// knows best what became of its request (a claim withdrawn after a long
	// outage must not be taken for a dead owner's). ErrNotOwner if token no
	// longer holds the claim.
	Release(ctx context.Context, key Key, token Token) error

	// Renew extends the lease of the claim held by token to lease from
	// now. ErrNotOwner if token no longer holds the claim.
	Renew(ctx context.Context, key Key, token Token, lease time.Duration) error
}

// RecordLimit is a store that keeps no record over a size its max_bytes
// sets: Complete fails for a larger one. A handler whose
// max_response_body the store cannot keep is refused at provision.
type RecordLimit interface {
	// MaxRecordBytes is the size of the largest record the store keeps, as
	// AppendRecord encodes it.
	MaxRecordBytes() int64
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
// ...) was under way, in ErrUnavailable.
func Unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}
