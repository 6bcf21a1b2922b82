package postgres

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// row holds the columns of a record as Acquire and Lookup select them, in
// that order: state, token, endpoint, fingerprint, status, headers, body,
// truncated, created_at.
type row struct {
	state, endpoint                   string
	token, fingerprint, headers, body []byte
	status                            int32
	truncated                         bool
	created                           time.Time
}

// record decodes r.
func (s *Store) record(r *row) (*store.Record, error) {
	rec := &store.Record{
		Endpoint:  r.endpoint,
		CreatedAt: r.created,
		Status:    int(r.status),
		Body:      r.body,
		Truncated: r.truncated,
	}
	switch r.state {
	case "in_progress":
		rec.State = store.InProgress
	case "completed":
		rec.State = store.Completed
	default:
		return nil, s.unavailable("decoding record", fmt.Errorf("unknown state %q", r.state))
	}
	if len(r.token) != len(rec.Token) || len(r.fingerprint) != len(rec.Fingerprint) {
		return nil, s.unavailable("decoding record", errors.New("token or fingerprint of the wrong size"))
	}
	copy(rec.Token[:], r.token)
	copy(rec.Fingerprint[:], r.fingerprint)
	if r.headers != nil {
		h, err := parseHeaders(r.headers)
		if err != nil {
			return nil, s.unavailable("decoding headers", err)
		}
		rec.Header = h
	}
	return rec, nil
}
