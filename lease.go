package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// leases looks after a handler's running claims, with one goroutine that
// runs while requests do, rather than timers per request:
//
//   - It renews a claim once a third of its lease has passed, so a slow
//     request never runs twice while a dead owner's claim frees itself
//     within a lease. A failed renewal is retried with backoff while the
//     lease holds: a store outage shorter than that costs nothing.
//   - The client's disconnect does not cancel its work (the answer is stored
//     for its retry), but once the client has been gone for one lease the
//     work is cancelled, so a hung upstream cannot hold the claim for ever.
type leases struct {
	store   store.Store
	metrics *metrics
	logger  *zap.Logger
	lease   time.Duration
	tick    time.Duration

	mu      sync.Mutex
	runs    map[*run]struct{} // the running requests
	running bool              // the goroutine is alive
}

const (
	leaseTicks    = 12
	minLeaseTick  = 5 * time.Millisecond
	minRenewRetry = 50 * time.Millisecond
	renewFraction = 3 // renew once lease/renewFraction has passed
)

// run is one request holding a claim; fields after cancel are under leases.mu.
type run struct {
	key    store.Key
	token  store.Token
	client context.Context    // the request's own context: done when the client leaves
	cancel context.CancelFunc // ends the work

	held      time.Time // when the claim lapses unless renewed
	claimedAt time.Time // when it was last claimed or renewed
	goneAt    time.Time // when the client was first seen gone
	renewing  bool      // a renewal is in flight, or the claim is lost
	cancelled bool
	done      bool
}

func newLeases(s store.Store, lease time.Duration, m *metrics, logger *zap.Logger) *leases {
	return &leases{store: s, metrics: m, logger: logger, lease: lease, tick: max(lease/leaseTicks, minLeaseTick),
		runs: make(map[*run]struct{})}
}

// start registers a request that just claimed its key, and returns its
// work's context: the request's values, not its cancellation. Call stop.
// The lease is counted from sent, when the claim went to the store: the
// store's lease began when the claim reached it, before its reply came
// back, and a reply slow by most of a lease must not push the first
// renewal past the store's lease.
func (l *leases) start(client context.Context, key store.Key, tok store.Token, sent time.Time) (*run, context.Context) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(client))
	r := &run{key: key, token: tok, client: client, cancel: cancel, claimedAt: sent, held: sent.Add(l.lease)}
	l.mu.Lock()
	l.runs[r] = struct{}{}
	if !l.running {
		l.running = true
		go l.watch()
	}
	l.mu.Unlock()
	return r, ctx
}

// stop unregisters r and cancels its work: no renewal starts after it
// returns, and one in flight is ignored.
func (l *leases) stop(r *run) {
	l.mu.Lock()
	r.done = true
	delete(l.runs, r)
	l.mu.Unlock()
	r.cancel()
}

// watch checks the running requests every tick, and ends when none is left.
func (l *leases) watch() {
	t := time.NewTicker(l.tick)
	defer t.Stop()
	for now := range t.C {
		l.mu.Lock()
		if len(l.runs) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		for r := range l.runs {
			l.check(r, now)
		}
		l.mu.Unlock()
	}
}

// check starts what is due for r; l.mu is held.
func (l *leases) check(r *run, now time.Time) {
	if !r.renewing && now.Sub(r.claimedAt) >= l.lease/renewFraction {
		r.renewing = true
		go l.renew(r, r.held)
	}
	switch {
	case r.cancelled:
	case r.goneAt.IsZero():
		if r.client.Err() != nil {
			r.goneAt = now
		}
	case now.Sub(r.goneAt) >= l.lease:
		r.cancelled = true
		r.cancel()
	}
}

// renew renews r's claim, retrying until it lapses at held.
func (l *leases) renew(r *run, held time.Time) {
	for retry := minRenewRetry; !l.stopped(r); retry = min(2*retry, l.lease/renewFraction) {
		// A renewal may take at most what is left of the lease.
		ctx, cancel := context.WithDeadline(detached(r.client), held)
		start := time.Now()
		err := l.store.Renew(ctx, r.key, r.token, l.lease)
		cancel()

		l.mu.Lock()
		if r.done {
			l.mu.Unlock()
			return
		}
		switch {
		case err == nil:
			r.claimedAt, r.held, r.renewing = start, start.Add(l.lease), false
			l.mu.Unlock()
			l.metrics.renewed()
			return
		case errors.Is(err, store.ErrNotOwner):
			l.mu.Unlock() // r.renewing stays set: there is nothing left to renew
			l.logger.Error("claim lost while the request runs; a duplicate may run it too",
				zap.String("key_hash", r.key.String()))
			return
		}
		l.mu.Unlock()
		l.logger.Warn("renewing the claim failed", zap.String("key_hash", r.key.String()), zap.Error(err))
		left := time.Until(held)
		if left <= 0 {
			return // the claim lapsed; r.renewing stays set
		}
		time.Sleep(min(retry, left))
	}
}

func (l *leases) stopped(r *run) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return r.done
}
