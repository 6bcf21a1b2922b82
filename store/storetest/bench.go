package storetest

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// SizingEndpoint and SizingHeader make the records that the sizing
// benchmarks write look like a JSON API's: an endpoint of ordinary length
// and the headers such an API answers with, after the handler dropped the
// per-caller ones (Set-Cookie, Date, Content-Length).
const SizingEndpoint = "POST api.example.com/v1/payments"

func sizingHeader() http.Header {
	return http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/v1/payments/pay_3f9a1c2b7d"},
		"X-Request-Id":  {"6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"},
		"Cache-Control": {"no-store"},
	}
}

// SizingCase is one kind of record the sizing benchmarks write.
type SizingCase struct {
	Name       string
	BodyLen    int
	ClaimsOnly bool
}

// SizingCases are the records whose size the README reports: completed
// with a small and a 4 KiB response, and claims in flight.
var SizingCases = []SizingCase{
	{"completed_200B", 200, false},
	{"completed_4KiB", 4096, false},
	{"claim", 0, true},
}

// Fill writes n records with fresh keys into s, with 16 writers: claims
// with lease, completed with a body of bodyLen bytes kept for ttl unless
// claimsOnly. Every record has the same body. It fails tb at the first
// error.
func Fill(tb testing.TB, s store.Store, n, bodyLen int, claimsOnly bool, lease, ttl time.Duration) {
	tb.Helper()
	// Random letters and digits: barely compressible, so the figures are
	// an upper bound where a store compresses (PostgreSQL's TOAST does for
	// values over about 2 KiB; Redis does not).
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	body := make([]byte, bodyLen)
	for i := range body {
		body[i] = alphabet[rand.IntN(len(alphabet))]
	}
	header := sizingHeader()
	const writers = 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := w; i < n; i += writers {
				c := &store.Claim{Token: NewToken(), Endpoint: SizingEndpoint, Fingerprint: store.Fingerprint(NewKey()), CreatedAt: time.Now(), Lease: lease}
				k := NewKey()
				if _, err := s.Acquire(ctx, k, c); err != nil {
					errs <- err
					return
				}
				if claimsOnly {
					continue
				}
				resp := &store.Response{Status: http.StatusCreated, Header: header, Body: body}
				if err := s.Complete(ctx, k, c, resp, ttl); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("filling the store: %v", err)
	}
}

// BenchmarkReplay measures a replay: Acquire of a key whose response,
// resp, is completed and stored in s. It returns the key.
func BenchmarkReplay(b *testing.B, s store.Store, resp *store.Response) store.Key {
	b.Helper()
	ctx, k, c := context.Background(), NewKey(), newClaim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, k, c, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	// One retry's claim serves every replay: a replay records nothing of
	// it, and the allocation of a claim per call, which the interface
	// call would move to the heap, is not the store's.
	retry := &store.Claim{Token: NewToken(), Endpoint: c.Endpoint, Fingerprint: c.Fingerprint, Lease: c.Lease}
	b.ReportAllocs()
	for b.Loop() {
		if got, err := s.Acquire(ctx, k, retry); got.Record == nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", got, err)
		}
	}
	return k
}

// JSONResponse is a response as a JSON API answers it: a 4 KiB body and
// its Content-Type.
func JSONResponse() *store.Response {
	return &store.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, 4096)}
}
