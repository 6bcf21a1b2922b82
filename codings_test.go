package idempotency

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestAcceptsCodings(t *testing.T) {
	for _, tc := range []struct {
		accept  []string
		codings []string
		want    bool
	}{
		{nil, []string{"gzip"}, false},
		{[]string{"gzip"}, []string{"gzip"}, true},
		{[]string{"GZIP;q=0.5"}, []string{"gzip"}, true},
		{[]string{"x-gzip"}, []string{"gzip"}, true},
		{[]string{"gzip"}, []string{"x-gzip"}, true},
		{[]string{"gzip;q=0"}, []string{"gzip"}, false},
		{[]string{"*"}, []string{"zstd"}, true},
		{[]string{"*, zstd;q=0"}, []string{"zstd"}, false},
		{[]string{"*;q=0"}, []string{"gzip"}, false},
		{[]string{"br", "zstd"}, []string{"zstd"}, true},
		{[]string{"gzip"}, []string{"gzip, zstd"}, false},
		{[]string{"gzip, zstd"}, []string{"gzip", "zstd"}, true},
		{nil, []string{"identity"}, true},
		{[]string{"identity"}, []string{"deflate"}, false},
	} {
		if got := acceptsCodings(tc.accept, tc.codings); got != tc.want {
			t.Errorf("Accept-Encoding %q, Content-Encoding %q: %t, want %t", tc.accept, tc.codings, got, tc.want)
		}
	}
}

func TestDecodeBody(t *testing.T) {
	plain := bytes.Repeat([]byte("tea, "), 100)
	compress := func(w io.WriteCloser, buf *bytes.Buffer) []byte {
		w.Write(plain)
		w.Close()
		return buf.Bytes()
	}
	var gz, zl, raw, zs, both bytes.Buffer
	zsw, _ := zstd.NewWriter(&zs)
	fw, _ := flate.NewWriter(&raw, flate.BestSpeed)
	for _, tc := range []struct {
		codings []string
		body    []byte
		ok      bool
	}{
		{[]string{"gzip"}, compress(gzip.NewWriter(&gz), &gz), true},
		{[]string{"deflate"}, compress(zlib.NewWriter(&zl), &zl), true},
		{[]string{"deflate"}, compress(fw, &raw), true},
		{[]string{"zstd"}, compress(zsw, &zs), true},
		{[]string{"br"}, []byte("anything"), false},
		{[]string{"gzip"}, []byte("not gzip"), false},
	} {
		got, ok := decoded(tc.codings, tc.body)
		if ok != tc.ok || (ok && !bytes.Equal(got, plain)) {
			t.Errorf("%q: ok %t, %d bytes; want ok %t", tc.codings, ok, len(got), tc.ok)
		}
	}
	// gzip applied first, then zstd: undone in the reverse order
	inner := compress(gzip.NewWriter(&both), &both)
	var outer bytes.Buffer
	zw, _ := zstd.NewWriter(&outer)
	zw.Write(inner)
	zw.Close()
	got, _ := decoded([]string{"gzip, zstd"}, outer.Bytes())
	if !bytes.Equal(got, plain) {
		t.Errorf("gzip, zstd: not decoded in reverse order")
	}
}

// decoded is body with codings undone, as a replay writes it.
func decoded(codings []string, body []byte) ([]byte, bool) {
	var out bytes.Buffer
	n, err := copyDecoded(&out, codings, body, maxDecodedBody+1)
	return out.Bytes(), err == nil && n <= maxDecodedBody
}
