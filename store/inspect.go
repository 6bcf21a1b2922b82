package store

import (
	"context"
	"slices"
	"strings"
	"time"
)

// Inspector is implemented by stores that let an operator look at their
// records and purge them: the admin API and the `caddy idempotency` command
// use it. It is separate from Store because the handler never needs it.
//
// Its methods see the same live records as Acquire: a record whose lease or
// TTL has passed is absent, whether or not the backend has deleted it yet.
type Inspector interface {
	// Lookup returns the live record of key and when it expires (the end
	// of the lease while in progress, of the TTL once completed; zero if
	// the backend keeps it without expiry), or a nil record if there is
	// none. The record is the whole record, body included.
	Lookup(ctx context.Context, key Key) (rec *Record, expiresAt time.Time, err error)

	// Delete removes key's record whatever its state and owner, and
	// reports whether a live record was there. Deleting an in-progress
	// claim lets a retry run while its first request may still be running:
	// the owner's Complete then fails with ErrNotOwner.
	Delete(ctx context.Context, key Key) (bool, error)

	// InFlight lists at most limit in-progress claims created at least
	// olderThan ago, oldest first among those it found. Stores that can
	// only scan their keys (Redis) stop once they have found limit claims,
	// which are then not necessarily the oldest of all.
	InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]Entry, error)
}

// Summary is what a listing tells of a record: everything but the owner
// token, the fingerprint, the headers and the body, whose size alone is
// given (of a sealed body, the size of what is stored).
type Summary struct {
	State     State
	Endpoint  string
	CreatedAt time.Time
	Status    int
	BodySize  int
	Truncated bool
	// OutcomeUnknown is Record.OutcomeUnknown.
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
	// ExpiresAt is when the lease (in progress) or the TTL (completed)
	// ends; zero if the backend keeps the record without expiry.
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
