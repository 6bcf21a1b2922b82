package idempotency

import (
	"bytes"
	"io"
	"net/http"
)

// readBody buffers up to limit bytes of r's body, for the key and the
// fingerprint, and puts an identical body back for the next handler. The
// buffer is the request's alone: a RoundTripper may read a request's body
// after RoundTrip returned, so a buffer shared with later requests could
// hand one client's bytes to another's upstream. body is nil when r has
// none.
func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.ContentLength > limit {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, false, nil
	}
	body, err = readUpTo(r.Body, r.ContentLength, limit+1)
	switch {
	case err != nil:
		return nil, false, err
	case int64(len(body)) > limit:
		return nil, true, nil
	}
	r.Body.Close()
	// r.GetBody stays nil: with it, net/http's transport counts a request
	// with an Idempotency-Key as replayable, and resends it on a failed
	// reused connection to an upstream that may have run it.
	r.Body = &bodyReader{Reader: *bytes.NewReader(body)}
	return body, false, nil
}

// bodyReader gives the next handler the buffered body.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

const minRead = 512 // the first read's size, as bytes.Buffer's

// readUpTo reads src to its end, or limit bytes. The buffer doubles as
// bytes arrive, never past the declared length (-1 if none): a client that
// declares a megabyte and sends a kilobyte holds a kilobyte.
func readUpTo(src io.Reader, declared, limit int64) ([]byte, error) {
	var b []byte
	for int64(len(b)) < limit {
		if len(b) == cap(b) {
			n := int64(max(minRead, 2*cap(b)))
			if declared > int64(len(b)) {
				n = min(n, declared)
			}
			grown := make([]byte, len(b), min(n, limit))
			copy(grown, b)
			b = grown
		}
		n, err := src.Read(b[len(b):min(int64(cap(b)), limit)])
		b = b[:len(b)+n]
		switch {
		case err == io.EOF:
			return b, nil
		case err != nil:
			return nil, err
		case int64(len(b)) == declared:
			return b, nil // net/http's bodies end at their Content-Length
		}
	}
	return b, nil
}
