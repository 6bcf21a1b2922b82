package sealing

import (
	"bytes"
	"net/http"
	"strconv"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// BenchmarkSealOpen is the cost of encryption_keys per record: one seal
// (on completion) and one open (on each replay) of a response with a few
// headers and a body of each size. MB/s counts the body.
func BenchmarkSealOpen(b *testing.B) {
	ring, err := NewKeyring([]string{sealKeyA})
	if err != nil {
		b.Fatal(err)
	}
	key := store.NewKey("", "bench")
	c := &store.Claim{Endpoint: "POST api.example.com/v1/orders"}
	for _, size := range []int{1 << 10, 64 << 10} {
		resp := &store.Response{Status: 201, Body: bytes.Repeat([]byte("x"), size), Header: http.Header{
			"Content-Type": {"application/json"}, "Location": {"/v1/orders/42"}, "X-Request-Id": {"4bf92f3577b34da6"},
		}}
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				sealed, err := ring.seal(key, c, resp)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ring.open(key, &store.Record{State: store.Completed, Endpoint: c.Endpoint, Response: *sealed}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
