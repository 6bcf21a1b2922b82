package postgres

import (
	"encoding/json"
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

// A record whose outcome is unknown is a completed row with truncated set
// and status 0, which no answered request has (the handler stores the
// status it sent, and net/http refuses statuses under 100). The table
// needs no column of its own for it, so the tables of earlier versions,
// created by the store or by hand, hold it as they are.
//
// outcomeColumns returns the status and truncated columns for rec.
func outcomeColumns(rec *store.Record) (status int, truncated bool) {
	if rec.OutcomeUnknown {
		return 0, true
	}
	return rec.Status, rec.Truncated
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
	if r.state == "completed" && r.truncated && r.status == 0 {
		rec.Truncated, rec.OutcomeUnknown = false, true
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
		if err := json.Unmarshal(r.headers, &rec.Header); err != nil {
			return nil, s.unavailable("decoding headers", err)
		}
	}
	return rec, nil
}
