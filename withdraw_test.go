package idempotency

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// A claim that reached the store while its reply was lost answered its
// request 503: nothing ran. With keep it must never become an unknown
// outcome: the claim is withdrawn until the store takes the withdrawal,
// however long past its lease the store stays away, and a retry through
// this instance lands the withdrawal before it claims the key. A retry
// through another instance a little later finds the key free too.
func TestClaimOfA503NeverBecomesUnknown(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	keep := func(h *Handler) {
		h.LockTimeout = caddy.Duration(time.Second)
		h.OnUnknownOutcome = app.UnknownKeep
	}
	h := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+proxy.Addr()+`"]}`), keep)
	other := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+srv.Addr()+`"]}`), keep)
	b := &backend{}
	wantStatus(t, do(h, b, post("/pay", "warm-up", "")), http.StatusCreated)

	// The claims reach Redis; their replies, and everything after them,
	// are lost.
	proxy.SetLatencies(0, time.Minute)
	time.AfterFunc(300*time.Millisecond, func() { proxy.Blackhole(true) })
	var wg sync.WaitGroup
	for _, key := range []string{"here", "elsewhere"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wantProblem(t, do(h, b, post("/pay", key, `{"amount":100}`)), http.StatusServiceUnavailable, "Idempotency store unavailable")
		}()
	}
	wg.Wait()
	time.Sleep(2500 * time.Millisecond) // the store stays away past the claims' lease

	proxy.Cut()
	proxy.Heal()
	wantStatus(t, do(h, b, post("/pay", "here", `{"amount":100}`)), http.StatusCreated)
	time.Sleep(3 * time.Second) // the withdrawal's next try lands
	wantStatus(t, do(other, b, post("/pay", "elsewhere", `{"amount":100}`)), http.StatusCreated)
	if n := b.runs.Load(); n != 3 { // the warm-up and the two retries
		t.Errorf("the upstream ran %d times, want 3", n)
	}
}
