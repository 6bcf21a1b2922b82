package idempotency

import (
	"bytes"
	"errors"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// recorder streams the response to the client as the next handler writes
// it and keeps a copy, up to a limit, for the store. It never reports a
// failed client write to the handler above it: the client of the first
// request may be gone, yet the upstream's answer must still be read whole
// and stored, so that the client's retry gets it (the headline story: the
// payment succeeded, the response was lost, the retry must not pay again).
type recorder struct {
	http.ResponseWriter
	limit int64

	status      int
	outer       http.Header // the header map as the handlers before this one left it; reused
	header      http.Header // what the handlers after this one set, without per-caller fields
	declared    []string    // the Trailer header's values: names set after the body
	buf         *bytes.Buffer
	size        int64
	overflow    bool // the body outgrew limit; buf was dropped
	clientGone  bool
	wroteHeader bool
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer keeps the odd megabyte response from pinning memory in
// the pool forever.
const maxPooledBuffer = 64 << 10

func putBuffer(b *bytes.Buffer) {
	if b != nil && b.Cap() <= maxPooledBuffer {
		b.Reset()
		bufPool.Put(b)
	}
}

var recorderPool = sync.Pool{New: func() any { return new(recorder) }}

// newRecorder wraps w, whose header holds what the handlers before this
// one set for this exchange (a request id, CORS headers): those are noted
// here, so that only what the handlers after it add is stored.
func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	rec := recorderPool.Get().(*recorder)
	*rec = recorder{ResponseWriter: w, limit: limit, outer: rec.outer}
	if h := w.Header(); len(h) > 0 {
		if rec.outer == nil {
			rec.outer = make(http.Header, len(h))
		}
		for name, values := range h {
			rec.outer[name] = values
		}
	}
	return rec
}

// free returns the recorder and its buffer to their pools; the caller must
// be done with rec.body().
func (rec *recorder) free() {
	putBuffer(rec.buf)
	clear(rec.outer)
	*rec = recorder{outer: rec.outer}
	recorderPool.Put(rec)
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
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.clientGone {
		if _, err := rec.ResponseWriter.Write(p); err != nil {
			rec.clientGone = true
		}
	}
	rec.size += int64(len(p))
	if !rec.overflow {
		if rec.size > rec.limit {
			// from here on the response only streams: a retry gets a
			// problem answer instead of a partial replay
			rec.overflow = true
			putBuffer(rec.buf)
			rec.buf = nil
		} else {
			if rec.buf == nil {
				rec.buf = bufPool.Get().(*bytes.Buffer)
			}
			rec.buf.Write(p)
		}
	}
	return len(p), nil
}

// FlushError lets flushes through (http.ResponseController prefers it to
// Flush), so streamed responses reach the client as they are produced.
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

// Unwrap gives http.ResponseController access to the connection's other
// controls (deadlines, hijacking).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// response is the whole answer, to store: the server answers an empty 200
// to a handler that wrote nothing.
func (rec *recorder) response() *store.Response {
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK
		rec.header = exchangeHeader(rec.ResponseWriter.Header(), rec.outer)
	}
	rec.addTrailers()
	return &store.Response{Status: status, Header: rec.header, Body: rec.body()}
}

func (rec *recorder) body() []byte {
	if rec.buf == nil {
		return nil
	}
	return rec.buf.Bytes()
}

// What of a response's header is stored. The handlers before this one
// (header, CORS) set headers for each exchange: they set them again for
// the retry, so only what the handlers after this one added or changed is
// stored (exchangeHeader).

// unstorableHeaders are never stored or replayed: cookies and
// authentication answers belong to the caller who received them, and the
// rest describe one connection or are recomputed on replay.
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

// exchangeHeader is what h holds beyond outer, the header as the handlers
// before this one left it: the names they did not set, whole; for the names
// they set, the values appended after theirs, or the whole list if it was
// replaced. It is nil when there is nothing to store.
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

// addTrailers adds to rec's stored header the trailers set after the body,
// under net/http's TrailerPrefix convention, which every store keeps as a
// header name: the names the Trailer header declared, and the names
// already written with the prefix.
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
