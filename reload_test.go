package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// A reload that changes the store block gives the new config a client of
// its own, and Caddy cleans up the old config while its requests still
// run: such a request must still store its response on the old client,
// for the new config to replay it.
func TestReloadChangingStoreKeepsRunningRequests(t *testing.T) {
	srv := testredis.Start(t)
	raw := func(pool int) json.RawMessage {
		return json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"],"pool_size":` + strconv.Itoa(pool) + `}`)
	}
	oldConfig, cleanUpOld := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cleanUpOld)
	old := new(Handler)
	old.StoreRaw = raw(16)
	if err := old.Provision(oldConfig); err != nil {
		t.Fatal(err)
	}
	b := &backend{blockers: make(chan struct{})}
	answered := make(chan response, 1)
	go func() { answered <- do(old, b, post("/pay", "reload-1", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })

	replacement := provision(t, raw(17), nil)
	cleanUpOld() // Caddy cleans up the old config's modules, its store among them
	b.blockers <- struct{}{}
	wantStatus(t, <-answered, 201)

	close(b.blockers)
	r := do(replacement, b, post("/pay", "reload-1", "x"))
	wantStatus(t, r, 201)
	if r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
		t.Fatalf("the retry on the new config ran the request again (runs %d), headers %v", b.runs.Load(), r.Header())
	}
}

// The same reload while the old config's response could not be stored
// (Redis was away) and is being retried in the background: the retries
// keep the old client open until they have stored it.
func TestReloadChangingStoreKeepsBackgroundRetries(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	oldConfig, cleanUpOld := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cleanUpOld)
	old := new(Handler)
	old.StoreRaw = json.RawMessage(`{"module":"redis","addresses":["` + proxy.Addr() + `"],"pool_size":16,"read_timeout":"200ms","dial_timeout":"200ms","write_timeout":"200ms"}`)
	old.LockTimeout = caddy.Duration(5 * time.Second)
	if err := old.Provision(oldConfig); err != nil {
		t.Fatal(err)
	}
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		proxy.Blackhole(true) // the store goes away while the upstream works
		proxy.Cut()
		w.WriteHeader(201)
		w.Write([]byte("paid"))
		return nil
	}}
	wantStatus(t, do(old, b, post("/pay", "reload-2", "x")), 201)

	replacement := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+srv.Addr()+`"],"pool_size":17}`),
		func(h *Handler) { h.LockTimeout = caddy.Duration(5 * time.Second) })
	cleanUpOld()
	time.Sleep(300 * time.Millisecond)
	proxy.Blackhole(false)
	b.serve = nil
	var r response
	waitFor(t, func() bool {
		r = do(replacement, b, post("/pay", "reload-2", "x"))
		return r.Code != 409
	})
	if r.Code != 201 || r.Body.String() != "paid" || r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
		t.Fatalf("retry on the new config got %d %q %v after %d runs, want the stored response after one", r.Code, r.Body, r.Header(), b.runs.Load())
	}
}
