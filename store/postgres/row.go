package postgres

import (
	"errors"
	"fmt"
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
	// bad is the first column that did not decode. A column records it
	// rather than failing the scan: in a batch, a scan error would end
	// the reading of the results of the statements after it, which
	// commit all the same (batch.go).
	bad   error
	dest  [14]any
	ndest int // how many of dest the statement fills
	// Acquire's parameters, which need no allocation of their own here.
	args [8]any
}

// reset clears what a scan wrote, for a statement run again.
func (r *row) reset() {
	r.rec, r.status, r.won, r.ttl, r.expires, r.bad = store.Record{}, 0, false, 0, time.Time{}, nil
}

// fail records err unless a column failed before.
func (r *row) fail(err error) {
	if r.bad == nil && err != nil {
		r.bad = err
	}
}

// dests returns the scan destinations of a row of the columns of lead,
// then state, token, endpoint, fingerprint, status, headers, body,
// truncated, outcome_unknown, sealed and created_at.
func (r *row) dests(lead ...any) []any {
	rec := &r.rec
	n := copy(r.dest[:], lead)
	n += copy(r.dest[n:], []any{
		(*stateColumn)(r), (*tokenColumn)(r), (*endpointColumn)(&rec.Endpoint),
		(*fingerprintColumn)(r), &r.status, (*headersColumn)(r),
		&rec.Body, &rec.Truncated, &rec.OutcomeUnknown, &rec.Sealed, (*timeColumn)(&rec.CreatedAt),
	})
	r.ndest = n
	return r.dest[:n]
}

// record finishes the scanned record, which expires at expires if
// completed, refusing a row without a state.
func (r *row) record(expires time.Time) (*store.Record, error) {
	if r.bad != nil {
		return nil, r.bad
	}
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
// a NULL leaves the field as it was (Acquire's row for a won claim). Those
// of type row decode into the row's record, and record a value they cannot
// decode in the row (bad) rather than fail the scan.

type stateColumn row

func (c *stateColumn) ScanBytes(b []byte) error {
	r := (*row)(c)
	switch {
	case b == nil:
	case string(b) == "in_progress":
		r.rec.State = store.InProgress
	case string(b) == "completed":
		r.rec.State = store.Completed
	default:
		r.fail(fmt.Errorf("unknown state %q", b))
	}
	return nil
}

type tokenColumn row

func (c *tokenColumn) ScanBytes(b []byte) error {
	r := (*row)(c)
	r.fail(scanFixed(r.rec.Token[:], b, "token"))
	return nil
}

type fingerprintColumn row

func (c *fingerprintColumn) ScanBytes(b []byte) error {
	r := (*row)(c)
	r.fail(scanFixed(r.rec.Fingerprint[:], b, "fingerprint"))
	return nil
}

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
type headersColumn row

func (c *headersColumn) ScanBytes(b []byte) error {
	if b == nil {
		return nil
	}
	r := (*row)(c)
	decoded, err := store.DecodeHeader(b)
	if err != nil {
		r.fail(fmt.Errorf("decoding headers: %w", err))
		return nil
	}
	r.rec.Header = decoded
	return nil
}

type timeColumn time.Time

func (t *timeColumn) ScanTimestamptz(v pgtype.Timestamptz) error {
	if v.Valid {
		*t = timeColumn(v.Time)
	}
	return nil
}
