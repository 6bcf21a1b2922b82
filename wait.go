package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// With on_conflict wait, a waiter wakes when the claim ends (store.AwaitEnd),
// signalled in this process or by a store.Notifier; polls cover lost wake-ups
// (every notifiedPoll) and stores that send none (backoff minPoll..maxPoll).
const (
	minPoll      = 10 * time.Millisecond
	maxPoll      = 250 * time.Millisecond
	notifiedPoll = time.Second
)

// wait answers a duplicate of a running request once that request ends, or
// with 409 once MaxWait has passed. If the owner released its claim (a 5xx)
// the waiter claims the key and runs the request itself, as a retry would.
func (a *attempt) wait() error {
	h := a.h
	h.metrics.waiter(1)
	defer h.metrics.waiter(-1)
	deadline := time.Now().Add(time.Duration(h.MaxWait))
	ctx, span := startSpan(a.r.Context(), "idempotency.wait", nil)
	poll := minPoll
	timer := time.NewTimer(time.Duration(h.MaxWait))
	defer timer.Stop()
	for {
		ended, unwatch := store.AwaitEnd(a.key)
		timer.Reset(nextPoll(ctx, h.notifier, a.key, poll, deadline))
		select {
		case <-a.r.Context().Done():
			// the client left; nothing ran for it, so nothing is lost
			unwatch()
			endWait(span, "client_left")
			a.result(resultConflict)
			return nil
		case <-ended:
		case <-timer.C:
		}
		unwatch()
		got, err := a.acquire(ctx)
		if got.TookOver {
			a.tookOver(got.Record)
		}
		rec := got.Record
		switch {
		case errors.Is(err, errClaimInFlight):
			// another request of this process is claiming the key: wait on
		case err != nil && a.r.Context().Err() != nil:
			endWait(span, "client_left")
			return a.storeFailed(err)
		case err != nil:
			endWait(span, "store_error")
			return a.storeFailed(err)
		case rec == nil:
			endWait(span, "owner_released")
			return a.run()
		case rec.State != store.InProgress || !rec.BoundTo(&a.claim):
			endWait(span, "owner_finished")
			return a.replay(rec)
		}
		if time.Until(deadline) <= 0 {
			endWait(span, "timeout")
			return a.refuse(problemOutstanding)
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
