package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
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

// A retry through the same instance, while the store still refuses the
// withdrawal of its key's earlier claim, is not claimed: once the store
// answers again, that claim, its lease passed, would be taken for a dead
// owner's, and with keep answer 502 although nothing ran (found by the
// history suite: the store came back in time to take the retry's claim,
// after the retry had given up landing the withdrawal).
func TestRetryWaitsForTheWithdrawal(t *testing.T) {
	h := provision(t, json.RawMessage(`{"module":"memory"}`), func(h *Handler) {
		h.LockTimeout = caddy.Duration(time.Second)
		h.OnUnknownOutcome = app.UnknownKeep
	})
	lossy := &lossyStore{Store: h.store}
	h.store, h.leases.store = lossy, lossy
	b := &backend{}
	lossy.loseReply.Store(true)
	lossy.refuseRelease.Store(true)
	wantProblem(t, do(h, b, post("/pay", "lost", `{"amount":100}`)), http.StatusServiceUnavailable, "Idempotency store unavailable")
	time.Sleep(1200 * time.Millisecond) // the claim's lease passes

	wantProblem(t, do(h, b, post("/pay", "lost", `{"amount":100}`)), http.StatusServiceUnavailable, "Idempotency store unavailable")
	lossy.refuseRelease.Store(false)
	wantStatus(t, do(h, b, post("/pay", "lost", `{"amount":100}`)), http.StatusCreated)
	if n := b.runs.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}

// lossyStore loses the reply of one claim that it takes, and refuses
// releases, as a store whose link fails would.
type lossyStore struct {
	store.Store
	loseReply, refuseRelease atomic.Bool
}

func (s *lossyStore) Acquire(ctx context.Context, k store.Key, c *store.Claim) (store.Acquired, error) {
	got, err := s.Store.Acquire(ctx, k, c)
	if err == nil && s.loseReply.Swap(false) {
		return store.Acquired{}, store.Unavailable("acquiring", errors.New("the reply was lost"))
	}
	return got, err
}

func (s *lossyStore) Release(ctx context.Context, k store.Key, tok store.Token) error {
	if s.refuseRelease.Load() {
		return store.Unavailable("releasing", errors.New("the store does not answer"))
	}
	return s.Store.Release(ctx, k, tok)
}
