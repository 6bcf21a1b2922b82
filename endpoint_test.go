package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func withHost(r *http.Request, host string) *http.Request {
	r.Host = host
	return r
}

// One API reached through ports, spellings of its host or instances that
// differ only in their port is one endpoint: the retry replays.
func TestEndpointIgnoresPortAndCase(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{}
		first := do(h, b, withHost(post("/orders", "k", "x"), "h"))
		wantStatus(t, first, 201)
		for _, host := range []string{"h:443", "H", "h:8081", "H:8082"} {
			r := do(h, b, withHost(post("/orders", "k", "x"), host))
			wantStatus(t, r, 201)
			if r.placeholder("http.idempotency.result") != "replay" {
				t.Fatalf("Host %q: result %q, want replay", host, r.placeholder("http.idempotency.result"))
			}
		}
		wantProblem(t, do(h, b, withHost(post("/orders", "k", "x"), "other:443")), 422, "Idempotency-Key is already used")
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

// Two instances of one service on one store, reached on different ports:
// concurrent duplicates spread over both run once, and none is taken for
// a request to another endpoint.
func TestTwoInstancesOnDifferentPortsShareKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		a, bh := provision(t, raw, nil), provision(t, raw, nil)
		b := &backend{blockers: make(chan struct{})}
		const n = 20
		codes := make([]int, n)
		var answered atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h, host := a, "127.0.0.1:8081"
				if i%2 == 1 {
					h, host = bh, "127.0.0.1:8082"
				}
				codes[i] = do(h, b, withHost(post("/orders", "dup", `{"x":1}`), host)).Code
				answered.Add(1)
			}()
		}
		// Every duplicate is answered while the owner is still blocked.
		waitFor(t, func() bool { return answered.Load() == n-1 })
		close(b.blockers)
		wg.Wait()
		count := map[int]int{}
		for _, c := range codes {
			count[c]++
		}
		if count[201] != 1 || count[409] != n-1 || b.runs.Load() != 1 {
			t.Fatalf("answers %v, %d runs; want 1 × 201, %d × 409, 1 run", count, b.runs.Load(), n-1)
		}
		r := do(bh, b, withHost(post("/orders", "dup", `{"x":1}`), "127.0.0.1:8082"))
		wantStatus(t, r, 201)
		if r.placeholder("http.idempotency.result") != "replay" {
			t.Fatalf("retry on the other instance: result %q", r.placeholder("http.idempotency.result"))
		}
	})
}

func TestEndpointTemplate(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		t.Run("without host", func(t *testing.T) {
			h := provision(t, raw, func(h *Handler) { h.Endpoint = "{http.request.method} {http.request.uri.path}" })
			b := &backend{}
			wantStatus(t, do(h, b, withHost(post("/orders", "shared", "x"), "api.example.com")), 201)
			r := do(h, b, withHost(post("/orders", "shared", "x"), "api.example.net"))
			wantStatus(t, r, 201)
			if r.placeholder("http.idempotency.result") != "replay" || b.runs.Load() != 1 {
				t.Fatalf("another host name of the API: result %q, %d runs", r.placeholder("http.idempotency.result"), b.runs.Load())
			}
			wantProblem(t, do(h, b, post("/refunds", "shared", "x")), 422, "Idempotency-Key is already used")
		})
		t.Run("with a header", func(t *testing.T) {
			h := provision(t, raw, func(h *Handler) {
				h.Endpoint = "{http.request.method} {http.request.uri.path} {http.request.header.X-Api-Version}"
			})
			b := &backend{}
			v1 := func() *http.Request {
				r := post("/orders", "versioned", "x")
				r.Header.Set("X-Api-Version", "1")
				return r
			}
			wantStatus(t, do(h, b, v1()), 201)
			wantStatus(t, do(h, b, v1()), 201)
			v2 := v1()
			v2.Header.Set("X-Api-Version", "2")
			r := do(h, b, v2)
			wantProblem(t, r, 422, "Idempotency-Key is already used")
			if !strings.Contains(r.Body.String(), "another endpoint") || b.runs.Load() != 1 {
				t.Fatalf("another API version: %s, %d runs", r.Body, b.runs.Load())
			}
		})
	})
}

// A bare key with a comma is two joined header lines: 400, before the store.
func TestKeyWithCommaRefused(t *testing.T) {
	h := provision(t, json.RawMessage(`{"module":"memory"}`), nil)
	b := &backend{}
	r := do(h, b, post("/orders", "a,b", "x"))
	wantProblem(t, r, 400, "Idempotency-Key is invalid")
	wantStatus(t, do(h, b, post("/orders", `"a,b"`, "x")), 201)
	if b.runs.Load() != 1 {
		t.Fatalf("backend ran %d times, want 1", b.runs.Load())
	}
}
