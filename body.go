package idempotency

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// readBody buffers the request body so that it can be fingerprinted, and
// puts back an identical body for the next handler. It refuses to read more
// than MaxRequestBody. The buffer grows as bytes arrive, never to the
// declared Content-Length at once: a client that declares a megabyte and
// sends a kilobyte holds a kilobyte. The caller releases the body when it
// is done with it.
func (h *Handler) readBody(r *http.Request) (body *bufferedBody, tooLarge bool, err error) {
	if h.payload.mode == modeNone {
		return nil, false, nil // the body is not fingerprinted: it streams on unread
	}
	if r.ContentLength > h.MaxRequestBody {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, false, nil
	}
	buf := bodyBuffers.Get().(*bodyBuffer)
	body = &bufferedBody{bodyBuffer: buf}
	limit := io.LimitedReader{R: r.Body, N: h.MaxRequestBody + 1}
	_, err = buf.buf.ReadFrom(&limit)
	switch {
	case err != nil:
		buf.put()
		return nil, false, err
	case int64(buf.buf.Len()) > h.MaxRequestBody:
		buf.put()
		return nil, true, nil
	}
	r.Body.Close()
	body.Reset(buf.buf.Bytes())
	buf.refs.Store(2) // the handler's, and the next handler's until it closes it
	r.Body = body
	return body, false, nil
}

// bufferedBody replays the buffered request body to the next handler.
//
// An http.RoundTripper may go on reading a request body after RoundTrip
// returned, until it closes it (an upstream that answered before reading
// all of it), and so after the handler returned. The pooled buffer goes
// back only once both the handler released it and the body was closed:
// otherwise another request's bytes could be read into it and sent on
// this request's upstream connection. The body itself is not pooled, so
// that a late second Close cannot drop another request's reference. A
// buffer whose body is never closed is left to the garbage collector.
type bufferedBody struct {
	bytes.Reader
	*bodyBuffer
	closed atomic.Bool
}

// bodyBuffer holds a request body's bytes, and the references to them:
// the handler's and the next handler's.
type bodyBuffer struct {
	buf  bytes.Buffer
	refs atomic.Int32
}

var bodyBuffers = sync.Pool{New: func() any { return new(bodyBuffer) }}

// Close implements io.Closer for the next handler; it drops that
// handler's reference once, however often it is called.
func (b *bufferedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.bodyBuffer.release()
	}
	return nil
}

// release drops the handler's reference; nil-safe, for a request without
// a body.
func (b *bufferedBody) release() {
	if b != nil {
		b.bodyBuffer.release()
	}
}

func (b *bodyBuffer) release() {
	if b.refs.Add(-1) == 0 {
		b.put()
	}
}

// put returns b to the pool, unless it grew too large to keep.
func (b *bodyBuffer) put() {
	if b.buf.Cap() <= maxPooledBuffer {
		b.buf.Reset()
		bodyBuffers.Put(b)
	}
}

// buffer is the body's bytes for the fingerprint; nil without a body.
func (b *bufferedBody) buffer() *bytes.Buffer {
	if b == nil {
		return nil
	}
	return &b.buf
}
