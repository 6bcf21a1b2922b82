package idempotency

import (
	"context"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Waiting duplicates (on_conflict wait): instead of 409, a duplicate of a
// running request waits for its outcome, then is answered as a retry would
// be. A waiter wakes up when the claim ends (store.AwaitEnd): the handler
// that held it signals the end in its own process, and a store that is a
// store.Notifier signals ends on other instances. Polling covers the rest:
// every notifiedPoll when the store promised a wake-up (a lost message, a
// dropped subscription), and otherwise with a backoff from minPoll to
// maxPoll, which covers owners on other instances of a store that sends no
// wake-ups. Each poll is one store round trip.
const (
	minPoll      = 10 * time.Millisecond
	maxPoll      = 250 * time.Millisecond
	notifiedPoll = time.Second
)

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
	timer := time.NewTimer(time.Duration(h.MaxWait))
	defer timer.Stop()
	for {
		ended, unwatch := store.AwaitEnd(key)
		timer.Reset(nextPoll(ctx, h.notifier, key, poll, deadline))
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
		case err != nil && r.Context().Err() != nil:
			endWait(span, "client_left")
			return h.acquireFailed(w, r, repl, next, key, c.Token, err)
		case err != nil:
			endWait(span, "store_error")
			return h.acquireFailed(w, r, repl, next, key, c.Token, err)
		case rec == nil:
			endWait(span, "owner_released")
			h.setResult(repl, resultNew)
			h.claimed(key, c)
			return h.execute(w, r, repl, next, key, c)
		case rec.State != store.InProgress || !boundTo(rec, c):
			endWait(span, "owner_finished")
			return h.answerFromRecord(w, r, repl, rec, c)
		}
		if time.Until(deadline) <= 0 {
			endWait(span, "timeout")
			return h.refuse(w, r, repl, resultConflict, h.problems.outstanding)
		}
		poll = min(2*poll, maxPoll)
	}
}

// nextPoll is how long a waiter sleeps unless woken: not at all if the
// claim ended before the store could arrange a wake-up, notifiedPoll once
// it has, and poll, the backoff, when it cannot; never past the deadline.
func nextPoll(ctx context.Context, n store.Notifier, key store.Key, poll time.Duration, deadline time.Time) time.Duration {
	left := time.Until(deadline)
	if n != nil {
		inProgress, err := n.Notify(ctx, key)
		switch {
		case err == nil && !inProgress:
			return 0
		case err == nil:
			return min(notifiedPoll, left)
		}
	}
	return min(poll, left)
}
