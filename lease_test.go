package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// The lease keeper's goroutine exists only while requests hold claims: it
// starts with the first and ends within a tick of the last, so an idle
// handler costs nothing. (TestSlowRequestKeepsItsClaim checks what its
// renewals achieve, TestHungUpstreamIsCancelledOneLeaseAfterTheClientLeft
// its end of abandoned work.)
func TestLeaseKeeperRunsOnlyWhileRequestsDo(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	running := func() bool {
		h.leases.mu.Lock()
		defer h.leases.mu.Unlock()
		return h.leases.running || len(h.leases.runs) > 0
	}
	if running() {
		t.Fatal("the keeper runs before any request")
	}
	b := &backend{blockers: make(chan struct{})}
	done := make(chan response)
	go func() { done <- do(h, b, post("/slow", "k", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	if !running() {
		t.Fatal("the keeper does not run while a request holds a claim")
	}
	time.Sleep(600 * time.Millisecond) // through a renewal: past a third of the lease, plus a tick
	close(b.blockers)
	wantStatus(t, <-done, 201)
	waitFor(t, func() bool { return !running() })
}

func TestHungUpstreamIsCancelledOneLeaseAfterTheClientLeft(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	cancelled := make(chan time.Time, 1)
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		<-r.Context().Done() // hangs until the handler gives up on it
		cancelled <- time.Now()
		// what reverse_proxy does when its request is cancelled
		w.WriteHeader(statusClientClosed)
		return nil
	}}
	ctx, leave := context.WithCancel(context.Background())
	req, _ := withReplacer(post("/p", "k", "x").WithContext(ctx))
	go h.ServeHTTP(httptest.NewRecorder(), req, b)
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	left := time.Now()
	leave()
	select {
	case at := <-cancelled:
		if d := at.Sub(left); d < 900*time.Millisecond || d > 3*time.Second {
			t.Fatalf("upstream cancelled %v after the client left, want one lock_timeout (1s)", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hung upstream was never cancelled after its client left")
	}
	// The failed attempt released the claim: the retry runs.
	b.serve = nil
	waitFor(t, func() bool { return do(h, b, post("/p", "k", "x")).Code == 201 })
}

func TestSlowRequestKeepsItsClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
		b := &backend{blockers: make(chan struct{})}
		done := make(chan response)
		go func() { done <- do(h, b, post("/slow", "k", "x")) }()
		waitFor(t, func() bool { return b.runs.Load() == 1 })
		// Duplicates keep arriving for three leases: the renewals must hold.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			wantStatus(t, do(h, b, post("/slow", "k", "x")), 409)
		}
		close(b.blockers)
		wantStatus(t, <-done, 201)
		wantStatus(t, do(h, b, post("/slow", "k", "x")), 201)
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

func TestDeadOwnersClaimIsTakenOver(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
		b := &backend{}
		// A request on another instance claimed the key and died: nobody
		// renews or completes it.
		req := post("/orders", "k", "x")
		key := store.NewKey("", "k")
		dead := &store.Claim{Token: storetest.NewToken(), Endpoint: fingerprint.Endpoint(fingerprint.DefaultEndpoint, req, nil), Fingerprint: h.payload.Of(req, []byte("x")), CreatedAt: time.Now(), Lease: time.Second}
		if got, err := h.store.Acquire(context.Background(), key, dead); got.Record != nil || err != nil {
			t.Fatalf("dead owner's claim: %v %v", got.Record, err)
		}
		start := time.Now()
		wantStatus(t, do(h, b, post("/orders", "k", "x")), 409)
		for do(h, b, post("/orders", "k", "x")).Code == 409 {
			if time.Since(start) > 5*time.Second {
				t.Fatal("dead owner's claim was never taken over")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if took := time.Since(start); took < 900*time.Millisecond {
			t.Fatalf("claim taken over after %v, before its 1s lease", took)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("backend ran %d times after the takeover, want 1", b.runs.Load())
		}
		// The dead owner, waking up, cannot overwrite the new owner's result.
		if err := h.store.Complete(context.Background(), key, dead, &store.Response{Status: 500}, time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("stale owner's Complete = %v, want ErrNotOwner", err)
		}
		wantStatus(t, do(h, b, post("/orders", "k", "x")), 201)
	})
}
