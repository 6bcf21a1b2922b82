package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// A reload that changes the memory store's block (its limits) keeps the
// table: a request that runs across the reload keeps its claim, its retry
// on the new config waits or replays, and the key never runs twice.
func TestReloadChangingMemoryStoreKeepsItsKeys(t *testing.T) {
	name := "reload-" + itoa(testSeq.Add(1))
	raw := func(limits string) json.RawMessage {
		return json.RawMessage(`{"module":"memory","name":"` + name + `"` + limits + `}`)
	}
	oldConfig, cleanUpOld := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cleanUpOld)
	old := &Handler{Options: app.Options{StoreRaw: raw("")}}
	if err := old.Provision(oldConfig); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	b := &backend{}
	b.serve = func(w http.ResponseWriter, r *http.Request) error {
		if b.runs.Load() == 1 {
			<-release // the first run spans the reload
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	answered := make(chan response, 1)
	go func() { answered <- do(old, b, post("/pay", "m9", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })

	replacement := provision(t, raw(`,"max_entries":200000`), nil)
	cleanUpOld()
	if r := do(replacement, b, post("/pay", "m9", "x")); r.Code != http.StatusConflict {
		close(release)
		t.Fatalf("a retry on the new config while the first request runs got %d, want 409 (runs %d)", r.Code, b.runs.Load())
	}
	close(release)
	wantStatus(t, <-answered, 201)

	r := do(replacement, b, post("/pay", "m9", "x"))
	wantStatus(t, r, 201)
	if r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
		t.Fatalf("the retry on the new config ran the request again (runs %d), headers %v", b.runs.Load(), r.Header())
	}
}
