package store

import (
	"context"
	"slices"
	"strings"
	"time"
)

// Inspector is implemented by stores that let an operator (the admin API,
// the `caddy idempotency` command) look at their records and purge them.
// Its methods see the same live records as Acquire: a record whose lease
// or TTL has passed is absent, whether or not the backend has deleted it.
type Inspector interface {
	// Lookup returns the whole live record of key and when its lease or
	// TTL ends (zero if the backend keeps it without expiry), or a nil
	// record if there is none.
	Lookup(ctx context.Context, key Key) (rec *Record, expiresAt time.Time, err error)

	// Delete removes key's record whatever its state and owner, and
	// reports whether a live record was there. The owner of a deleted
	// claim then fails with ErrNotOwner.
	Delete(ctx context.Context, key Key) (bool, error)

	// InFlight lists at most limit claims created at least olderThan ago,
	// oldest first among those found (Redis stops scanning at limit).
	InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]Entry, error)
}

// Summary is what a listing tells of a record: not its owner token,
// fingerprint, headers or body, whose stored size alone is given.
type Summary struct {
	State          State
	Endpoint       string
	CreatedAt      time.Time
	Status         int
	BodySize       int
	Truncated      bool
	OutcomeUnknown bool
}

// Summarize returns the summary of rec.
func Summarize(rec *Record) Summary {
	return Summary{
		State:          rec.State,
		Endpoint:       rec.Endpoint,
		CreatedAt:      rec.CreatedAt,
		Status:         rec.Status,
		BodySize:       len(rec.Body),
		Truncated:      rec.Truncated,
		OutcomeUnknown: rec.OutcomeUnknown,
	}
}

// Entry is one record of a listing.
type Entry struct {
	Key Key
	Summary
	// ExpiresAt is when the lease or the TTL ends; zero if the backend
	// keeps the record without expiry.
	ExpiresAt time.Time
}

// SortEntries orders entries oldest first, then by key, and keeps at most
// limit of them. Every Inspector returns its listing this way.
func SortEntries(entries []Entry, limit int) []Entry {
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(string(a.Key[:]), string(b.Key[:]))
	})
	if limit < 0 {
		limit = 0
	}
	if len(entries) > limit {
		entries = entries[:limit]
	}
	return entries
}
