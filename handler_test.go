package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// backend is the next handler: it counts executions and answers what the
// test sets, recording what it received.
type backend struct {
	mu       sync.Mutex
	runs     atomic.Int64
	bodies   [][]byte
	ctxErrs  []error
	serve    func(w http.ResponseWriter, r *http.Request) error
	blockers chan struct{} // when set, each run waits for a value
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	b.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	if b.blockers != nil {
		<-b.blockers
	}
	b.mu.Lock()
	b.bodies = append(b.bodies, body)
	b.ctxErrs = append(b.ctxErrs, r.Context().Err())
	b.mu.Unlock()
	if b.serve != nil {
		return b.serve(w, r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Order", "42")
	w.Header().Add("Set-Cookie", "session=first-caller")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"order":42}`))
	return nil
}

// storeConfigs are the backends every behaviour test runs against.
var storeConfigs = []struct {
	name string
	raw  func(t *testing.T) json.RawMessage
}{
	{"memory", func(t *testing.T) json.RawMessage {
		// A table of its own, so tests never share keys through the pool.
		return json.RawMessage(`{"module":"memory","max_entries":` + itoa(100000+testSeq.Add(1)) + `}`)
	}},
	{"redis", func(t *testing.T) json.RawMessage {
		srv := testredis.Start(t)
		return json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`)
	}},
}

var testSeq atomic.Int64

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// eachStore runs f once per store backend.
func eachStore(t *testing.T, f func(t *testing.T, raw json.RawMessage)) {
	for _, sc := range storeConfigs {
		t.Run(sc.name, func(t *testing.T) { f(t, sc.raw(t)) })
	}
}

// provision makes a ready handler; tweak adjusts the config first.
func provision(t *testing.T, raw json.RawMessage, tweak func(*Handler)) *Handler {
	t.Helper()
	h := &Handler{StoreRaw: raw}
	if tweak != nil {
		tweak(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return h
}

// observe sends the handler's logs to a recorder the test can read.
func observe(h *Handler) *observer.ObservedLogs {
	core, logs := observer.New(zap.DebugLevel)
	h.logger = zap.New(core)
	return logs
}

func withReplacer(req *http.Request) (*http.Request, *caddy.Replacer) {
	repl := caddyhttp.NewTestReplacer(req)
	return req, repl
}

type response struct {
	*httptest.ResponseRecorder
	repl *caddy.Replacer
	err  error
}

func (r response) placeholder(name string) string {
	v, _ := r.repl.GetString(name)
	return v
}

func post(path, key, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "http://api.example.com"+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// do runs req through h the way Caddy's server would: with a replacer.
func do(h *Handler, next caddyhttp.Handler, req *http.Request) response {
	req, repl := withReplacer(req)
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, req, next)
	return response{w, repl, err}
}

func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("ServeHTTP returned %v", r.err)
	}
	if r.Code != status {
		t.Fatalf("status %d, want %d; body %s", r.Code, status, r.Body)
	}
}

func wantProblem(t *testing.T, r response, status int, title string) {
	t.Helper()
	wantStatus(t, r, status)
	if ct := r.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type, Title, Detail string
		Status              int
	}
	if err := json.Unmarshal(r.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.Body, err)
	}
	if p.Title != title || p.Status != status || p.Type == "" || p.Detail == "" {
		t.Fatalf("problem %+v, want title %q status %d", p, title, status)
	}
}

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
