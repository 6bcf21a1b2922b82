package idempotency

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestFirstRequestRunsOnceAndRetryReplays(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{}
		first := do(h, b, post("/orders", "k1", `{"sku":"tea"}`))
		wantStatus(t, first, 201)
		if first.Header().Get("Set-Cookie") == "" || first.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("first response headers %v", first.Header())
		}
		if got := first.placeholder("http.idempotency.result"); got != "new" {
			t.Fatalf("result placeholder %q, want new", got)
		}
		keyHash := first.placeholder("http.idempotency.key")
		if len(keyHash) != 64 || strings.Contains(keyHash, "k1") {
			t.Fatalf("key placeholder %q, want a 64-digit hash", keyHash)
		}
		for range 3 {
			retry := do(h, b, post("/orders", `"k1"`, `{"sku":"tea"}`))
			wantStatus(t, retry, 201)
			if !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) {
				t.Fatalf("replayed body %q, want %q", retry.Body, first.Body)
			}
			hd := retry.Header()
			if hd.Get("Idempotent-Replayed") != "true" || hd.Get("X-Order") != "42" ||
				hd.Get("Content-Type") != "application/json" || hd.Get("Content-Length") != "12" {
				t.Fatalf("replayed headers %v", hd)
			}
			if _, ok := hd["Set-Cookie"]; ok {
				t.Fatalf("Set-Cookie replayed to another caller: %v", hd)
			}
			if got := retry.placeholder("http.idempotency.result"); got != "replay" {
				t.Fatalf("result placeholder %q, want replay", got)
			}
			if got := retry.placeholder("http.idempotency.key"); got != keyHash {
				t.Fatalf("sf-string and bare spelling gave keys %q and %q", got, keyHash)
			}
		}
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

func TestKeyBoundToEndpointAndPayload(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.Methods = []string{"POST", "PUT"} })
		b := &backend{}
		wantStatus(t, do(h, b, post("/orders?region=eu", "k", `{"amount":100}`)), 201)

		put := post("/orders?region=eu", "k", `{"amount":100}`)
		put.Method = http.MethodPut
		otherHost := post("/orders?region=eu", "k", `{"amount":100}`)
		otherHost.Host = "other.example.com"
		for name, req := range map[string]*http.Request{
			"other path":   post("/refunds?region=eu", "k", `{"amount":100}`),
			"other method": put,
			"other host":   otherHost,
		} {
			r := do(h, b, req)
			wantProblem(t, r, 422, "Idempotency-Key is already used")
			if !strings.Contains(r.Body.String(), "another endpoint") {
				t.Errorf("%s: detail %s", name, r.Body)
			}
		}
		for name, req := range map[string]*http.Request{
			"other body":  post("/orders?region=eu", "k", `{"amount":200}`),
			"other query": post("/orders?region=us", "k", `{"amount":100}`),
			"no body":     post("/orders?region=eu", "k", ``),
		} {
			r := do(h, b, req)
			wantProblem(t, r, 422, "Idempotency-Key is already used")
			if !strings.Contains(r.Body.String(), "different payload") || r.placeholder("http.idempotency.result") != "mismatch" {
				t.Errorf("%s: detail %s", name, r.Body)
			}
		}
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{blockers: make(chan struct{})}
		const n = 50
		results := make([]response, n)
		var finished atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = do(h, b, post("/orders", "dup", `{"x":1}`))
				finished.Add(1)
			}()
		}
		// Every duplicate is answered while the owner is still blocked.
		waitFor(t, func() bool { return finished.Load() == n-1 })
		if b.runs.Load() != 1 {
			t.Fatalf("backend ran %d times while the owner was blocked", b.runs.Load())
		}
		close(b.blockers)
		wg.Wait()
		created, conflicts := 0, 0
		for _, r := range results {
			switch r.Code {
			case 201:
				created++
			case 409:
				wantProblem(t, r, 409, "A request is outstanding for this Idempotency-Key")
				if r.Header().Get("Retry-After") == "" || r.placeholder("http.idempotency.result") != "conflict" {
					t.Fatalf("409 without Retry-After or conflict result: %v", r.Header())
				}
				conflicts++
			default:
				t.Fatalf("unexpected status %d: %s", r.Code, r.Body)
			}
		}
		if created != 1 || conflicts != n-1 || b.runs.Load() != 1 {
			t.Fatalf("%d created, %d conflicts, %d runs; want 1, %d, 1", created, conflicts, b.runs.Load(), n-1)
		}
		wantStatus(t, do(h, b, post("/orders", "dup", `{"x":1}`)), 201)
		if b.runs.Load() != 1 {
			t.Fatal("retry after completion ran again")
		}
	})
}
