package idempotency

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// The store's lease starts when the claim reaches it, before its reply
// comes back: a late reply must not push the first renewal past the
// store's lease, or a duplicate claims the key and both run. Here the
// claim's reply takes 800ms of a 1s lease; a duplicate comes at 1.25s,
// after that lease, while the first request still runs.
func TestLeaseClockStartsBeforeTheClaim(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	raw := json.RawMessage(`{"module":"redis","addresses":["` + proxy.Addr() + `"]}`)
	h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	release := make(chan struct{})
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		if r.Header.Get("Idempotency-Key") == "warm-up" {
			w.WriteHeader(http.StatusCreated)
			return nil
		}
		proxy.SetLatencies(0, 0) // what the store says from now on is on time
		<-release
		w.WriteHeader(http.StatusCreated)
		return nil
	}}

	// Warm the connection, so that the claim's only delay is the reply's.
	wantStatus(t, do(h, b, post("/p", "warm-up", "")), http.StatusCreated)
	proxy.SetLatencies(0, 800*time.Millisecond)
	var wg sync.WaitGroup
	wg.Add(1)
	var first response
	go func() {
		defer wg.Done()
		first = do(h, b, post("/p", "k", "x"))
	}()
	time.Sleep(1250 * time.Millisecond)
	time.AfterFunc(500*time.Millisecond, func() { close(release) }) // a duplicate that runs waits too
	dup := do(h, b, post("/p", "k", "x"))
	wg.Wait()
	wantStatus(t, first, http.StatusCreated)
	if dup.Code != http.StatusConflict && dup.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("the duplicate after the store's first lease got %d, want 409 or the replay: the claim lapsed before its first renewal", dup.Code)
	}
	if n := b.runs.Load(); n != 2 { // the warm-up and the first request
		t.Errorf("the upstream ran %d times, want 2", n)
	}
}
