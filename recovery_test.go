package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

func TestStoreOutage(t *testing.T) {
	srv := testredis.Start(t)
	raw := json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`)
	closed := provision(t, raw, nil)
	closedLogs := watchLogs(closed)
	open := provision(t, raw, func(h *Handler) { h.OnStoreError = app.FailOpen })
	openLogs := watchLogs(open)
	b := &backend{}
	secretKey, secretBody := "secret-key-1234", `{"card":"4242424242424242"}`

	wantStatus(t, do(closed, b, post("/p", "before", "x")), 201)
	srv.Kill()

	r := do(closed, b, post("/p", secretKey, secretBody))
	wantProblem(t, r, 503, "Idempotency store unavailable")
	if r.Header().Get("Retry-After") == "" || r.placeholder("http.idempotency.result") != "error" {
		t.Fatalf("503 without Retry-After or error result: %v", r.Header())
	}
	if b.runs.Load() != 1 {
		t.Fatal("fail_closed ran the request while the store was down")
	}
	wantStatus(t, do(open, b, post("/p", secretKey, secretBody)), 201)
	if b.runs.Load() != 2 {
		t.Fatal("fail_open did not pass the request through")
	}
	for _, logs := range []any{closedLogs.All(), openLogs.All()} {
		text, _ := json.Marshal(logs)
		if strings.Contains(string(text), secretKey) || strings.Contains(string(text), "4242") {
			t.Fatalf("a raw key or body reached the logs: %s", text)
		}
	}
	if closedLogs.Len() == 0 || openLogs.Len() == 0 {
		t.Fatal("the outage was not logged")
	}

	srv.Restart(t)
	// Recovery needs no restart of Caddy: the next request just works.
	waitFor(t, func() bool { return do(closed, b, post("/p", "after", "x")).Code == 201 })
	wantStatus(t, do(closed, b, post("/p", "after", "x")), 201)
	if got := do(closed, b, post("/p", "after", "x")); got.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay after recovery")
	}
}

// The store is unreachable at the moment the response is to be stored, and
// back within the lease: the response is stored in the background, and
// the retry is a replay instead of a second execution.
func TestResponseStoredOnceTheStoreRecovers(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	h := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+proxy.Addr()+`"],"read_timeout":"200ms","dial_timeout":"200ms","write_timeout":"200ms"}`),
		func(h *Handler) { h.LockTimeout = caddy.Duration(5 * time.Second) })
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		proxy.Blackhole(true) // the store goes away while the upstream works
		proxy.Cut()
		w.WriteHeader(201)
		w.Write([]byte("paid"))
		return nil
	}}
	wantStatus(t, do(h, b, post("/pay", "k", "x")), 201)
	time.Sleep(500 * time.Millisecond)
	proxy.Blackhole(false)
	b.serve = nil
	var r response
	waitFor(t, func() bool {
		r = do(h, b, post("/pay", "k", "x"))
		return r.Code != 409 && r.Code != 503
	})
	if r.Code != 201 || r.Body.String() != "paid" || r.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the store recovered got %d %q %v, want the stored response", r.Code, r.Body, r.Header())
	}
	if n := b.runs.Load(); n != 1 {
		t.Fatalf("backend ran %d times, want 1", n)
	}
}

// With every background slot busy, a response the store refused is not
// retried: that is said and counted, not left to the log's earlier promise.
func TestBackgroundRetryWithoutASlotIsLoggedAndCounted(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	h := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+proxy.Addr()+`"],"read_timeout":"200ms","dial_timeout":"200ms","write_timeout":"200ms"}`), nil)
	logs := watchLogs(h)
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		proxy.Blackhole(true)
		proxy.Cut()
		w.WriteHeader(201)
		return nil
	}}
	for range cap(background) {
		background <- struct{}{}
	}
	defer func() {
		for range cap(background) {
			<-background
		}
	}()
	before := testutil.ToFloat64(collectors.retriesSkipped)
	wantStatus(t, do(h, b, post("/pay", "k", "x")), 201)
	if n := logs.FilterMessageSnippet("no background slot").Len(); n != 1 {
		t.Errorf("%d log entries about the skipped retry, want 1: %v", n, logs.All())
	}
	if n := testutil.ToFloat64(collectors.retriesSkipped) - before; n != 1 {
		t.Errorf("background_retries_skipped_total grew by %v, want 1", n)
	}
}
