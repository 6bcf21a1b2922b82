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
// than limit bytes. The buffer grows as bytes arrive, never to the
// declared Content-Length at once: a client that declares a megabyte and
// sends a kilobyte holds a kilobyte. The caller releases the body when it
// is done with it.
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
	// r.GetBody stays nil although the body could now be replayed: with
	// one, net/http's transport counts a request that carries an
	// Idempotency-Key as replayable, and resends it when a reused
	// connection fails after the request was written, to an upstream
	// that may have run it.
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
	closed   atomic.Bool
	handedOn bool // the next handler got it; set and read by the handler's goroutine
}

// bodyBuffer holds a request body's bytes, and the references to them:
// the handler's and the next handler's.
type bodyBuffer struct {
	data []byte
	refs atomic.Int32
}

// minRead is the first read's size, as bytes.Buffer's.
const minRead = 512

// readFrom reads src to its end, or limit bytes. The buffer grows as the
// bytes arrive, doubling, but never past a declared length (-1 if none):
// a body that keeps its word fills its buffer exactly, and a client that
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

// Close implements io.Closer for the next handler; it drops that
// handler's reference once, however often it is called.
func (b *bufferedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.bodyBuffer.release()
	}
	return nil
}

// handOn notes that r, whose body the handler may have buffered, goes to
// the next handler, which then holds the body until it closes it.
func handOn(r *http.Request) {
	if b, ok := r.Body.(*bufferedBody); ok {
		b.handedOn = true
	}
}

// release drops the handler's reference, and the body's too if the next
// handler never got it (a replay, a refusal); nil-safe, for a request
// without a body.
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
