package idempotency

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// readBody buffers up to limit bytes of body for the fingerprint, and puts
// an identical body back for the next handler; the caller releases it.
func readBody(r *http.Request, limit int64) (body *bufferedBody, tooLarge bool, err error) {
	if r.ContentLength > limit {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, false, nil
	}
	buf := bodyBuffers.Get().(*bodyBuffer)
	body = &bufferedBody{bodyBuffer: buf}
	err = buf.readFrom(r.Body, r.ContentLength, limit+1)
	switch {
	case err != nil:
		buf.put()
		return nil, false, err
	case int64(len(buf.data)) > limit:
		buf.put()
		return nil, true, nil
	}
	r.Body.Close()
	body.Reset(buf.data)
	buf.refs.Store(2) // the handler's, and the next handler's until it closes it
	// r.GetBody stays nil: with it, net/http's transport counts a request
	// with an Idempotency-Key as replayable, and resends it on a failed
	// reused connection to an upstream that may have run it.
	r.Body = body
	return body, false, nil
}

// bufferedBody replays the buffered body to the next handler. A RoundTripper
// may read it after RoundTrip returned, until it closes it: so the pooled
// buffer goes back only once the handler released it and the body was
// closed, lest another request's bytes reach this request's upstream (one
// never closed is left to the GC). The body is not pooled, so a late second
// Close cannot drop another request's reference.
type bufferedBody struct {
	bytes.Reader
	*bodyBuffer
	closed   atomic.Bool
	handedOn bool // the next handler got it; set and read by the handler's goroutine
}

// bodyBuffer holds a body's bytes, referenced by the handler and the next.
type bodyBuffer struct {
	data []byte
	refs atomic.Int32
}

const minRead = 512 // the first read's size, as bytes.Buffer's

// readFrom reads src to its end, or limit bytes. The buffer doubles as
// bytes arrive, never past the declared length (-1 if none): a client that
// declares a megabyte and sends a kilobyte holds a kilobyte.
func (b *bodyBuffer) readFrom(src io.Reader, declared, limit int64) error {
	for int64(len(b.data)) < limit {
		if len(b.data) == cap(b.data) {
			n := int64(max(minRead, 2*cap(b.data)))
			if declared > int64(len(b.data)) {
				n = min(n, declared)
			}
			grown := make([]byte, len(b.data), min(n, limit))
			copy(grown, b.data)
			b.data = grown
		}
		n, err := src.Read(b.data[len(b.data):min(int64(cap(b.data)), limit)])
		b.data = b.data[:len(b.data)+n]
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		case int64(len(b.data)) == declared:
			return nil // net/http's bodies end at their Content-Length
		}
	}
	return nil
}

var bodyBuffers = sync.Pool{New: func() any { return new(bodyBuffer) }}

// Close drops the next handler's reference, once however often called.
func (b *bufferedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.bodyBuffer.release()
	}
	return nil
}

// handOn notes that r's buffered body, if any, is the next handler's to close.
func handOn(r *http.Request) {
	if b, ok := r.Body.(*bufferedBody); ok {
		b.handedOn = true
	}
}

// release drops the handler's reference, and the body's if the next
// handler never got it (a replay, a refusal). It is nil-safe.
func (b *bufferedBody) release() {
	if b == nil {
		return
	}
	if !b.handedOn {
		b.Close()
	}
	b.bodyBuffer.release()
}

func (b *bodyBuffer) release() {
	if b.refs.Add(-1) == 0 {
		b.put()
	}
}

// put returns b to the pool, unless it grew too large to keep.
func (b *bodyBuffer) put() {
	if cap(b.data) <= maxPooledBuffer {
		b.data = b.data[:0]
		bodyBuffers.Put(b)
	}
}

// contents are the body's bytes, for the fingerprint; nil without a body.
func (b *bufferedBody) contents() []byte {
	if b == nil {
		return nil
	}
	return b.data
}
