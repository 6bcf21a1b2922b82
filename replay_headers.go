package idempotency

import (
	"net/http"
	"time"
)

// What a client is told of its key on the answers that have a record:
// replay_header ... always marks first answers "false", expiry_header
// says when the record expires. Both are off by default; the recorder
// calls setFirstHeaders only when one is on.

var falseValue = []string{"false"}

// setsFirstHeaders says whether first answers get a header of their own.
func (h *Handler) setsFirstHeaders() bool { return h.ReplayHeaderAlways || h.ExpiryHeader != "" }

// setFirstHeaders sets the headers of a first answer with status, as it goes
// out: after the recorder has taken the header to store, so that a replay
// never carries them.
func (h *Handler) setFirstHeaders(hdr http.Header, status int) {
	if h.ReplayHeaderAlways {
		hdr[h.ReplayHeader] = falseValue
	}
	if h.ExpiryHeader != "" {
		// Only an answer that is stored has a record to expire. The record
		// is stored as the answer ends, so it expires a little after this.
		if end, _ := h.decideClaimEnd(responseFacts{wroteHeader: true, status: status}); end == endStore {
			hdr[h.expiryField] = []string{time.Now().Add(h.ttl).UTC().Format(http.TimeFormat)}
		}
	}
}

// setReplayHeaders sets the expiry of a replayed record: its own, as stored.
func (h *Handler) setReplayHeaders(hdr http.Header, expires time.Time) {
	if h.ExpiryHeader != "" && !expires.IsZero() {
		hdr[h.expiryField] = []string{expires.UTC().Format(http.TimeFormat)}
	}
}
