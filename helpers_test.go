package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/memory"
)

// The helpers of the root package's tests: the stores every behaviour test
// runs against, handlers provisioned on them, the next handler behind them,
// the requests sent and what is checked of the answers.

// TestMain stops the PostgreSQL server that the tests may have started.
func TestMain(m *testing.M) {
	code := m.Run()
	if pgServer != nil {
		pgServer.Close()
	}
	os.Exit(code)
}

// One PostgreSQL server serves every handler test; each test gets a table
// of its own. initdb costs seconds, a table costs milliseconds.
var (
	pgOnce   sync.Once
	pgServer *testpg.Server
	pgErr    error
)

func sharedPostgres(t testing.TB) *testpg.Server {
	pgOnce.Do(func() { pgServer, pgErr = testpg.New() })
	if pgErr != nil {
		t.Fatalf("starting PostgreSQL: %v", pgErr)
	}
	return pgServer
}

// storeConfigs are the backends every behaviour test runs against.
var storeConfigs = []struct {
	name string
	raw  func(t *testing.T) json.RawMessage
}{
	{"memory", func(t *testing.T) json.RawMessage {
		// A table of its own, so tests never share keys through the pool.
		return json.RawMessage(`{"module":"memory","name":"memory-` + itoa(testSeq.Add(1)) + `"}`)
	}},
	{"redis", func(t *testing.T) json.RawMessage {
		srv := testredis.Start(t)
		return json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`)
	}},
	{"postgres", func(t *testing.T) json.RawMessage {
		dsn, _ := json.Marshal(sharedPostgres(t).DSN())
		return json.RawMessage(fmt.Sprintf(`{"module":"postgres","dsn":%s,"table":"idem_%d"}`, dsn, testSeq.Add(1)))
	}},
	{"file", func(t *testing.T) json.RawMessage {
		path, _ := json.Marshal(t.TempDir())
		return json.RawMessage(`{"module":"file","path":` + string(path) + `}`)
	}},
}

// docsURL is where problem types point by default (problem_base).
const docsURL = app.DefaultProblemBase + "#"

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
	h := &Handler{Options: app.Options{StoreRaw: raw}}
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

// provisionNamed provisions a handler on the store raw configures, as
// provision does, and returns it with the name under which that store
// registered.
func provisionNamed(t *testing.T, raw json.RawMessage, tweak func(*Handler)) (*Handler, string) {
	t.Helper()
	before := registeredNames()
	h := provision(t, raw, tweak)
	var added []string
	for _, n := range registeredNames() {
		if !slices.Contains(before, n) {
			added = append(added, n)
		}
	}
	if len(added) != 1 {
		t.Fatalf("provisioning %s registered %v, want one store", raw, added)
	}
	return h, added[0]
}

// registeredNames lists the names of the stores registered for the admin
// API.
func registeredNames() []string {
	var names []string
	for _, r := range store.Registered() {
		names = append(names, r.Name)
	}
	return names
}

// openMemory provisions a memory store with a table of its own.
func openMemory(t *testing.T) *memory.Memory {
	t.Helper()
	m := &memory.Memory{Name: "memory-" + itoa(testSeq.Add(1))}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Cleanup() })
	return m
}

// observe sends the handler's logs to a recorder the test can read.
func watchLogs(h *Handler) *observer.ObservedLogs {
	core, logs := observer.New(zap.DebugLevel)
	h.logger = zap.New(core)
	if h.scope != nil {
		h.scope.logger = h.logger
	}
	if h.leases != nil {
		h.leases.logger = h.logger
	}
	return logs
}

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

// post is a POST to api.example.com with the key, if any, and the body.
func post(path, key, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "http://api.example.com"+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// withReplacer gives req the replacer that Caddy's server would.
func withReplacer(req *http.Request) (*http.Request, *caddy.Replacer) {
	repl := caddyhttp.NewTestReplacer(req)
	return req, repl
}

// response is what a request served through do got: the response, the
// request's placeholders and the error the handler returned.
type response struct {
	*httptest.ResponseRecorder
	repl *caddy.Replacer
	err  error
}

func (r response) placeholder(name string) string {
	v, _ := r.repl.GetString(name)
	return v
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
	if cc := r.Header().Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store", cc)
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

// waitFor polls cond for up to 10 seconds: long enough for a loaded CI
// machine, bounded so that a broken build fails instead of hanging.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		waitTick()
	}
}

func waitTick() { time.Sleep(5 * time.Millisecond) }
