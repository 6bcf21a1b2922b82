package idempotency

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"

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
	old := &Handler{StoreRaw: raw(16)}
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
