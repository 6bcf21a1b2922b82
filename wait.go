package idempotency

import (
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Waiting duplicates (on_conflict wait): instead of 409, a duplicate of a
// running request waits for its outcome, then is answered as a retry would
// be. A waiter wakes up when the owner in this process finishes (an
// in-process broadcast) and otherwise polls the store with a backoff, which
// covers owners on other instances; each poll is one store round trip, and
// the poll interval stays between minPoll and maxPoll.
const (
	minPoll = 10 * time.Millisecond
	maxPoll = 250 * time.Millisecond
)

// broadcast wakes the waiters of a key when its claim ends in this
// process; the one instance is finished, declared with the handler's
// process-wide state.
type broadcast struct {
	mu      sync.Mutex
	watches map[store.Key]*watch
}

type watch struct {
	ch      chan struct{}
	waiters int
}

// watch returns a channel closed when a claim on k ends in this process,
// and a function that withdraws the caller's interest, so that watches of
// keys owned by other instances do not pile up.
func (b *broadcast) watch(k store.Key) (<-chan struct{}, func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wt, ok := b.watches[k]
	if !ok {
		wt = &watch{ch: make(chan struct{})}
		b.watches[k] = wt
	}
	wt.waiters++
	return wt.ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if wt.waiters--; wt.waiters == 0 && b.watches[k] == wt {
			delete(b.watches, k)
		}
	}
}

// done wakes every waiter on k. It is cheap when nobody waits: a map
// lookup under a lock held for nanoseconds.
func (b *broadcast) done(k store.Key) {
	b.mu.Lock()
	wt, ok := b.watches[k]
	if ok {
		delete(b.watches, k)
	}
	b.mu.Unlock()
	if ok {
		close(wt.ch)
	}
}

// wait answers a duplicate of a running request once that request ends, or
// with 409 once MaxWait has passed. If the owner released its claim (a 5xx)
// the waiter claims the key and runs the request itself, as a retry would.
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, key store.Key, c *store.Claim) error {
	h.metrics.waiter(1)
	defer h.metrics.waiter(-1)
	deadline := time.Now().Add(time.Duration(h.MaxWait))
	// The polls' spans are the wait's children.
	ctx, span := startSpan(r.Context(), "idempotency.wait", nil)
	poll := minPoll
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		ended, unwatch := finished.watch(key)
		select {
		case <-r.Context().Done():
			// The client left; nothing ran for it, so nothing is lost.
			unwatch()
			endWait(span, "client_left")
			h.setResult(repl, resultConflict)
			return nil
		case <-ended:
		case <-timer.C:
		}
		unwatch()
		rec, err := h.store.Acquire(ctx, key, c)
		switch {
		case err != nil:
			endWait(span, "store_error")
			return h.acquireFailed(w, r, repl, next, key, c.Token, err)
		case rec == nil:
			endWait(span, "owner_released")
			h.setResult(repl, resultNew)
			h.claimed(key, c)
			return h.execute(w, r, repl, next, key, c)
		case rec.State != store.InProgress || !h.sameEndpoint(rec.Endpoint, c.Endpoint) || rec.Fingerprint != c.Fingerprint:
			endWait(span, "owner_finished")
			return h.answerFromRecord(w, r, repl, rec, c)
		}
		left := time.Until(deadline)
		if left <= 0 {
			endWait(span, "timeout")
			return h.refuse(w, r, repl, resultConflict, h.problems.outstanding)
		}
		poll = min(2*poll, maxPoll, left)
		timer.Reset(poll)
	}
}
