package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// countingStore wraps a real store to show which requests reach it.
type countingStore struct {
	store.Store
	calls atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, k store.Key, cl *store.Claim) (*store.Record, error) {
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

func TestUpstreamReceivesBodyExactly(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{}
	body := make([]byte, 0, 256*40)
	for range 40 {
		for c := range 256 {
			body = append(body, byte(c))
		}
	}
	req := httptest.NewRequest(http.MethodPost, "http://h/p", bytes.NewReader(body))
	req.ContentLength = -1 // as if chunked
	req.Header.Set("Idempotency-Key", "bin")
	wantStatus(t, do(h, b, req), 201)
	if !bytes.Equal(b.bodies[0], body) {
		t.Fatalf("upstream got %d bytes, not the %d sent", len(b.bodies[0]), len(body))
	}
}

func TestRequestBodyLimit(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.MaxRequestBody = 10 })
	b := &backend{}
	wantStatus(t, do(h, b, post("/p", "k", "0123456789")), 201)
	wantProblem(t, do(h, b, post("/p", "k2", "0123456789A")), 413, "Request body too large")
	chunked := post("/p", "k3", "0123456789A")
	chunked.ContentLength = -1
	r := do(h, b, chunked)
	wantProblem(t, r, 413, "Request body too large")
	if r.placeholder("http.idempotency.result") != "too_large" || b.runs.Load() != 1 {
		t.Fatalf("result %q, %d runs", r.placeholder("http.idempotency.result"), b.runs.Load())
	}
}

// flushRecorder records when flushes reach the client.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushedAt []int // body length at each flush
}

func (f *flushRecorder) Flush() {
	f.flushedAt = append(f.flushedAt, f.Body.Len())
	f.ResponseRecorder.Flush()
}

func TestLargeResponseStreamsAndIsNotReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.MaxResponseBody = 1 << 20 })
		chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(200)
			for range 32 { // 2 MiB
				w.Write(chunk)
				http.NewResponseController(w).Flush()
			}
			return nil
		}}
		req := post("/export", "big", "x")
		w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		req, _ = withReplacer(req)
		if err := h.ServeHTTP(w, req, b); err != nil {
			t.Fatal(err)
		}
		if w.Body.Len() != 32*len(chunk) {
			t.Fatalf("client got %d bytes, want all %d", w.Body.Len(), 32*len(chunk))
		}
		if len(w.flushedAt) != 32 || w.flushedAt[0] != len(chunk) {
			t.Fatalf("flushes did not pass through as written: %v", w.flushedAt[:min(3, len(w.flushedAt))])
		}
		r := do(h, b, post("/export", "big", "x"))
		wantProblem(t, r, 409, "The response for this Idempotency-Key cannot be replayed")
		if r.Header().Get("Retry-After") != "" || b.runs.Load() != 1 {
			t.Fatalf("too-large retry: Retry-After %q, %d runs", r.Header().Get("Retry-After"), b.runs.Load())
		}
	})
}

func TestResponseAtLimitIsReplayed(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.MaxResponseBody = 64 })
	body := bytes.Repeat([]byte("z"), 64)
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error { w.Write(body); return nil }}
	wantStatus(t, do(h, b, post("/p", "k", "x")), 200)
	r := do(h, b, post("/p", "k", "x"))
	if !bytes.Equal(r.Body.Bytes(), body) || b.runs.Load() != 1 {
		t.Fatalf("a response of exactly max_response_body was not replayed: %q", r.Body)
	}
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

func TestRefusalsBecomeErrorsForHandleErrors(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{blockers: make(chan struct{})}
	defer close(b.blockers)
	go do(h, b, post("/p", "k", "x"))
	waitFor(t, func() bool { return b.runs.Load() == 1 })

	srv := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	req := post("/p", "k", "x")
	req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, srv))
	r := do(h, b, req)
	var he caddyhttp.HandlerError
	if !errors.As(r.err, &he) || he.StatusCode != 409 {
		t.Fatalf("with error routes, a conflict returned %v, want a 409 HandlerError", r.err)
	}
	if r.Header().Get("Retry-After") == "" || r.Body.Len() != 0 {
		t.Fatalf("error route gets headers %v and body %q; want Retry-After and no body yet", r.Header(), r.Body)
	}
	if got := r.placeholder("http.idempotency.problem.title"); got != "A request is outstanding for this Idempotency-Key" {
		t.Fatalf("title placeholder %q", got)
	}
	if got := r.placeholder("http.idempotency.problem.body"); !strings.Contains(got, `"status":409`) {
		t.Fatalf("body placeholder %q", got)
	}
}
