package idempotency

import (
	"bytes"
	"errors"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// recorder streams the response to the client and keeps a copy, up to
// limit, for the store. It never reports a failed client write: the client
// may be gone, yet the answer must still be read whole and stored for its
// retry (the payment succeeded, the response was lost).
type recorder struct {
	http.ResponseWriter
	limit int64

	status       int
	outer        http.Header // the header map as the handlers before this one left it
	header       http.Header // what the handlers after this one set, without per-caller fields
	declared     []string    // the Trailer header's values: names set after the body
	buf          bytes.Buffer
	size         int64
	overflow     bool // the body outgrew limit; buf was emptied
	clientGone   bool
	wroteHeader  bool
	firstHeaders *Handler // sets a first answer's own headers; nil when none
}

// newRecorder wraps w, noting the header the handlers before this one set
// (a request id, CORS), so that only what later handlers add is stored.
func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	rec := &recorder{ResponseWriter: w, limit: limit}
	if h := w.Header(); len(h) > 0 {
		rec.outer = maps.Clone(h)
	}
	return rec
}

func (rec *recorder) WriteHeader(status int) {
	if rec.wroteHeader {
		return
	}
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		// informational answers (103 Early Hints) pass through unrecorded
		rec.ResponseWriter.WriteHeader(status)
		return
	}
	rec.wroteHeader = true
	rec.status = status
	h := rec.ResponseWriter.Header()
	rec.header = exchangeHeader(h, rec.outer)
	rec.declared = h["Trailer"]
	if rec.firstHeaders != nil {
		rec.firstHeaders.setFirstHeaders(h, status)
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rec.status) {
		// net/http refuses it (respond "x" 204): the client gets no body,
		// nor will its retry. No error: a handler returning it would have
		// its whole answer stored as one that broke off.
		return len(p), nil
	}
	if !rec.clientGone {
		if _, err := rec.ResponseWriter.Write(p); err != nil {
			rec.clientGone = true
		}
	}
	rec.size += int64(len(p))
	if !rec.overflow {
		if rec.size > rec.limit {
			// only streams from here: a retry gets a problem, not a partial replay
			rec.overflow = true
			rec.buf = bytes.Buffer{}
		} else {
			rec.buf.Write(p)
		}
	}
	return len(p), nil
}

// FlushError passes flushes on; http.ResponseController prefers it to Flush.
func (rec *recorder) FlushError() error {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.clientGone {
		return nil
	}
	err := http.NewResponseController(rec.ResponseWriter).Flush()
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		rec.clientGone = true
	}
	return nil
}

// Unwrap gives http.ResponseController the connection's other controls.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// response is the answer to store: an empty 200 if the handler wrote nothing.
func (rec *recorder) response() *store.Response {
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK
		rec.header = exchangeHeader(rec.ResponseWriter.Header(), rec.outer)
	}
	rec.addTrailers()
	return &store.Response{Status: status, Header: rec.header, Body: rec.body()}
}

// bodyAllowed is net/http's bodyAllowedForStatus: 1xx, 204 and 304 have
// no body.
func bodyAllowed(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}

func (rec *recorder) body() []byte {
	if rec.overflow || rec.buf.Len() == 0 {
		return nil
	}
	return rec.buf.Bytes()
}

// unstorableHeaders are never stored: cookies and authentication answers
// belong to their caller; the rest describe one connection or are recomputed.
var unstorableHeaders = map[string]bool{
	"Set-Cookie":                true,
	"Set-Cookie2":               true,
	"Authentication-Info":       true,
	"Proxy-Authentication-Info": true,
	"Proxy-Authenticate":        true,
	"Connection":                true,
	"Keep-Alive":                true,
	"Transfer-Encoding":         true,
	"Upgrade":                   true,
	"Trailer":                   true,
	"Date":                      true,
	"Content-Length":            true,
	"Alt-Svc":                   true,
}

// exchangeHeader is what h holds beyond outer, which the handlers before
// this one set again on a retry: new names whole; for their names, the
// values appended after theirs, or the whole list if replaced. Nil if empty.
func exchangeHeader(h, outer http.Header) http.Header {
	var out http.Header
	for name, values := range h {
		if unstorableHeaders[name] || len(values) == 0 {
			continue
		}
		if old, ok := outer[name]; ok && len(values) >= len(old) && slices.Equal(values[:len(old)], old) {
			if values = values[len(old):]; len(values) == 0 {
				continue
			}
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[name] = values
	}
	return out
}

// addTrailers stores under net/http's TrailerPrefix the trailers that the
// Trailer header declared, and those already set with the prefix.
func (rec *recorder) addTrailers() {
	h := rec.ResponseWriter.Header()
	add := func(name string, values []string) {
		if rec.header == nil {
			rec.header = make(http.Header)
		}
		rec.header[name] = values
	}
	for _, line := range rec.declared {
		for name := range strings.SplitSeq(line, ",") {
			name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			if values := h[name]; len(values) > 0 && name != "" {
				add(http.TrailerPrefix+name, values)
			}
		}
	}
	for name, values := range h {
		if strings.HasPrefix(name, http.TrailerPrefix) && len(values) > 0 {
			add(name, values)
		}
	}
}
