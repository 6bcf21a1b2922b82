package idempotency

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
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
	header      http.Header // the response header as sent, without per-caller fields
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

func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	rec := recorderPool.Get().(*recorder)
	*rec = recorder{ResponseWriter: w, limit: limit}
	return rec
}

// free returns the recorder and its buffer to their pools; the caller must
// be done with rec.body().
func (rec *recorder) free() {
	putBuffer(rec.buf)
	*rec = recorder{}
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
	rec.header = storableHeader(rec.ResponseWriter.Header())
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

func (rec *recorder) body() []byte {
	if rec.buf == nil {
		return nil
	}
	return rec.buf.Bytes()
}

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

func storableHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for name, values := range h {
		if !unstorableHeaders[name] && len(values) > 0 {
			out[name] = values
		}
	}
	return out
}
