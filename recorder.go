package idempotency

import (
	"bytes"
	"errors"
	"net/http"
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

// record is the whole answer, to store: the server answers an empty 200
// to a handler that wrote nothing.
func (rec *recorder) record() *store.Record {
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK
		rec.header = exchangeHeader(rec.ResponseWriter.Header(), rec.outer)
	}
	rec.addTrailers()
	return &store.Record{Status: status, Header: rec.header, Body: rec.body()}
}

func (rec *recorder) body() []byte {
	if rec.buf == nil {
		return nil
	}
	return rec.buf.Bytes()
}
