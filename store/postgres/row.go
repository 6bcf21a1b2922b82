package postgres

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// row is what Acquire and Lookup scan a record row into: its columns go
// straight into rec, most decoded from the driver's buffer rather than
// from copies pgx would allocate.
type row struct {
	rec    store.Record
	status int32
	// The leading columns of Acquire's statements, and Lookup's.
	won     bool
	ttl     ttlColumn
	expires time.Time
	dest    [14]any
	// Acquire's parameters, which need no allocation of their own here.
	args [8]any
}

// dests returns the scan destinations of a row of the columns of lead,
// then state, token, endpoint, fingerprint, status, headers, body,
// truncated, outcome_unknown, sealed and created_at.
func (r *row) dests(lead ...any) []any {
	rec := &r.rec
	n := copy(r.dest[:], lead)
	n += copy(r.dest[n:], []any{
		(*stateColumn)(&rec.State), (*tokenColumn)(&rec.Token), (*endpointColumn)(&rec.Endpoint),
		(*fingerprintColumn)(&rec.Fingerprint), &r.status, (*headersColumn)(&rec.Header),
		&rec.Body, &rec.Truncated, &rec.OutcomeUnknown, &rec.Sealed, (*timeColumn)(&rec.CreatedAt),
	})
	return r.dest[:n]
}

// record finishes the scanned record, which expires at expires if
// completed, refusing a row without a state.
func (r *row) record(expires time.Time) (*store.Record, error) {
	if r.rec.State == 0 {
		return nil, errors.New("record without a state")
	}
	if r.rec.State == store.Completed { // a claim's status may be watchedStatus
		r.rec.Status = int(r.status)
		r.rec.ExpiresAt = expires
	}
	return &r.rec, nil
}

// The column types below scan from the driver's buffer, which pgx reuses;
// a NULL leaves the field as it was (Acquire's row for a won claim).

type stateColumn store.State

func (s *stateColumn) ScanBytes(b []byte) error {
	switch {
	case b == nil:
	case string(b) == "in_progress":
		*s = stateColumn(store.InProgress)
	case string(b) == "completed":
		*s = stateColumn(store.Completed)
	default:
		return fmt.Errorf("unknown state %q", b)
	}
	return nil
}

type tokenColumn store.Token

func (t *tokenColumn) ScanBytes(b []byte) error { return scanFixed(t[:], b, "token") }

type fingerprintColumn store.Fingerprint

func (f *fingerprintColumn) ScanBytes(b []byte) error { return scanFixed(f[:], b, "fingerprint") }

func scanFixed(dst, b []byte, what string) error {
	switch {
	case b == nil:
	case len(b) != len(dst):
		return fmt.Errorf("%s of %d bytes, want %d", what, len(b), len(dst))
	default:
		copy(dst, b)
	}
	return nil
}

// ttlColumn is a row's time to live, expires_at - now() by the database's
// clock: not positive once the row has expired.
type ttlColumn time.Duration

func (t *ttlColumn) ScanInterval(v pgtype.Interval) error {
	if v.Valid {
		// A difference of timestamps has no months, and days of 24 hours.
		*t = ttlColumn(time.Duration(v.Microseconds)*time.Microsecond + time.Duration(v.Days)*24*time.Hour)
	}
	return nil
}

type endpointColumn string

func (e *endpointColumn) ScanBytes(b []byte) error {
	if b != nil {
		*e = endpointColumn(b)
	}
	return nil
}

// headersColumn is the headers column, as store.AppendHeader writes it.
type headersColumn http.Header

func (h *headersColumn) ScanBytes(b []byte) error {
	if b == nil {
		return nil
	}
	decoded, err := store.DecodeHeader(b)
	if err != nil {
		return fmt.Errorf("decoding headers: %w", err)
	}
	*h = headersColumn(decoded)
	return nil
}

type timeColumn time.Time

func (t *timeColumn) ScanTimestamptz(v pgtype.Timestamptz) error {
	if v.Valid {
		*t = timeColumn(v.Time)
	}
	return nil
}
