package idempotency

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
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
		return h.leases.running || h.leases.head != nil
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
