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

// A claim that the store confirms only after much of its lease has passed
// (its command was held up on the way) is not run: its lease may already be
// over where the store keeps it, counted from when it was sent, and a
// duplicate may have taken it over. Found by the history suite: two
// requests of one key stalled together; the first's claim landed with its
// lease already past, the second took it over, and both ran.
func TestClaimConfirmedLateIsNotRun(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	raw := json.RawMessage(`{"module":"redis","addresses":["` + proxy.Addr() + `"],"read_timeout":"3s"}`)
	h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	wantStatus(t, do(h, b, post("/pay", "warm-up", "")), http.StatusCreated)

	// The first request's claim reaches Redis 1.2s late, after the lease it
	// was sent with; the second's comes a moment after it, on time.
	proxy.SetLatencies(1200*time.Millisecond, 0)
	time.AfterFunc(50*time.Millisecond, func() { proxy.SetLatencies(0, 0) })
	var wg sync.WaitGroup
	for _, at := range []time.Duration{0, 1250 * time.Millisecond} {
		wg.Go(func() {
			time.Sleep(at)
			start := time.Now()
			r := do(h, b, post("/pay", "stalled", "x"))
			t.Logf("sent at %v: %d (replayed %q) after %v, runs %d", at, r.Code, r.Header().Get("Idempotent-Replayed"), time.Since(start), b.runs.Load())
		})
	}
	wg.Wait()
	if n := b.runs.Load(); n > 2 { // the warm-up, and at most one of the two
		t.Errorf("the upstream ran the stalled key %d times, want at most once", n-1)
	}
}
