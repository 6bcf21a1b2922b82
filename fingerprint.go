package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
	"net/http"
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// readBody buffers the request body so that it can be fingerprinted, and
// puts back an identical body for the next handler. It refuses to read more
// than MaxRequestBody.
func (h *Handler) readBody(r *http.Request) (buf *bytes.Buffer, tooLarge bool, err error) {
	if r.ContentLength > h.MaxRequestBody {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, false, nil
	}
	buf = bufPool.Get().(*bytes.Buffer)
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	body := new(bufferedBody)
	body.limit = io.LimitedReader{R: r.Body, N: h.MaxRequestBody + 1}
	_, err = buf.ReadFrom(&body.limit)
	if err != nil {
		putBuffer(buf)
		return nil, false, err
	}
	if int64(buf.Len()) > h.MaxRequestBody {
		putBuffer(buf)
		return nil, true, nil
	}
	r.Body.Close()
	body.limit = io.LimitedReader{}
	body.Reset(buf.Bytes())
	r.Body = body
	return buf, false, nil
}

// bufferedBody replays the buffered request body to the next handler. It
// also holds the reader that bounded the read, so that reading and
// replaying cost one allocation.
type bufferedBody struct {
	bytes.Reader
	limit io.LimitedReader
}

func (*bufferedBody) Close() error { return nil }

// digest is a pooled SHA-256 state with its scratch space: written through
// the hash.Hash interface, arrays on the stack would escape to the heap.
type digest struct {
	hash.Hash
	n   [8]byte
	sum [sha256.Size]byte
}

var digests = sync.Pool{New: func() any { return &digest{Hash: sha256.New()} }}

// fingerprint hashes what the request carries: its query and its body. The
// query is length-prefixed so no query and body can pass for another pair.
func fingerprint(query string, body *bytes.Buffer) store.Fingerprint {
	d := digests.Get().(*digest)
	defer digests.Put(d)
	d.Reset()
	binary.BigEndian.PutUint64(d.n[:], uint64(len(query)))
	d.Write(d.n[:])
	io.WriteString(d, query)
	if body != nil {
		d.Write(body.Bytes())
	}
	return store.Fingerprint(d.Sum(d.sum[:0]))
}
