package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// countingStore wraps a real store to show which requests reach it.
type countingStore struct {
	store.Store
	calls atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, k store.Key, cl *store.Claim) (store.Acquired, error) {
	c.calls.Add(1)
	return c.Store.Acquire(ctx, k, cl)
}

func TestKeysValidatedBeforeStoreAccess(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.Required = true })
	cs := &countingStore{Store: h.store}
	h.store = cs
	b := &backend{}
	for name, header := range map[string][]string{
		"missing":      nil,
		"empty":        {""},
		"empty quote":  {`""`},
		"too long":     {strings.Repeat("a", 256)},
		"space":        {"a b"},
		"non-ascii":    {"caf\u00e9"},
		"unterminated": {`"abc`},
		"parameters":   {`"abc";x=1`},
		"repeated":     {"a", "a"},
	} {
		req := post("/orders", "", "x")
		req.Header["Idempotency-Key"] = header
		r := do(h, b, req)
		title := "Idempotency-Key is invalid"
		if header == nil {
			title = "Idempotency-Key is missing"
		}
		wantProblem(t, r, 400, title)
		if r.placeholder("http.idempotency.result") != "invalid" {
			t.Errorf("%s: result %q", name, r.placeholder("http.idempotency.result"))
		}
	}
	if cs.calls.Load() != 0 || b.runs.Load() != 0 {
		t.Fatalf("invalid keys reached the store %d times and the backend %d times", cs.calls.Load(), b.runs.Load())
	}
	wantStatus(t, do(h, b, post("/orders", strings.Repeat("a", 255), "x")), 201)
}

func TestKeylessAndOtherMethodsPassThrough(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{}
	for range 2 {
		r := do(h, b, post("/orders", "", "x"))
		wantStatus(t, r, 201)
		if r.placeholder("http.idempotency.result") != "bypass" {
			t.Fatalf("keyless result %q, want bypass", r.placeholder("http.idempotency.result"))
		}
	}
	// Browsers may send a key on any request: other methods ignore it.
	for range 2 {
		req := post("/orders", "k", "")
		req.Method = http.MethodGet
		wantStatus(t, do(h, b, req), 201)
	}
	if b.runs.Load() != 4 {
		t.Fatalf("backend ran %d times, want 4", b.runs.Load())
	}
}

func TestKeyHeaderAndMethodsConfigurable(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.KeyHeader = "x-request-key"
		h.Methods = []string{"put"}
		h.ReplayHeader = "x-replayed"
	})
	b := &backend{}
	put := func() *http.Request {
		req := httptest.NewRequest(http.MethodPut, "http://h/p", strings.NewReader("x"))
		req.Header.Set("X-Request-Key", "k")
		return req
	}
	wantStatus(t, do(h, b, put()), 201)
	r := do(h, b, put())
	if r.Header().Get("X-Replayed") != "true" || b.runs.Load() != 1 {
		t.Fatalf("custom header/method not honoured: %v, %d runs", r.Header(), b.runs.Load())
	}
	wantStatus(t, do(h, b, post("/p", "k", "x")), 201) // POST is no longer covered
	if b.runs.Load() != 2 {
		t.Fatal("POST was not passed through")
	}
}

func TestScopeSeparatesUsers(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.Scope = "{http.request.header.X-Tenant}" })
		b := &backend{}
		n := 0
		b.serve = func(w http.ResponseWriter, r *http.Request) error {
			n++
			w.Write([]byte(r.Header.Get("X-Tenant")))
			return nil
		}
		as := func(tenant string) *http.Request {
			req := post("/orders", "same-key", "x")
			req.Header.Set("X-Tenant", tenant)
			return req
		}
		a1, b1 := do(h, b, as("alice")), do(h, b, as("bob"))
		a2, b2 := do(h, b, as("alice")), do(h, b, as("bob"))
		if a1.Body.String() != "alice" || b1.Body.String() != "bob" || a2.Body.String() != "alice" || b2.Body.String() != "bob" {
			t.Fatalf("responses crossed users: %q %q %q %q", a1.Body, b1.Body, a2.Body, b2.Body)
		}
		if n != 2 || a1.placeholder("http.idempotency.key") == b1.placeholder("http.idempotency.key") {
			t.Fatalf("%d runs; keys %s %s", n, a1.placeholder("http.idempotency.key"), b1.placeholder("http.idempotency.key"))
		}
	})
}

func TestEmptyResponseIsStored(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{serve: func(http.ResponseWriter, *http.Request) error { return nil }}
	wantStatus(t, do(h, b, post("/p", "k", "x")), 200)
	r := do(h, b, post("/p", "k", "x"))
	if r.Code != 200 || r.Body.Len() != 0 || r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
		t.Fatalf("empty response not replayed: %d %q", r.Code, r.Body)
	}
}
