package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// leases looks after the claims of the requests that one handler is
// running, with one goroutine per handler rather than timers per request
// (most requests end long before anything is due):
//
//   - It renews a claim once a third of its lease has passed since it was
//     claimed or last renewed, so that a slow request is never run twice,
//     while a dead owner's claim still frees itself within one lease. A
//     failed renewal is retried at once with a backoff, for as long as the
//     lease holds: a store outage shorter than the rest of the lease costs
//     nothing.
//   - It ends work abandoned by its client. The client's disconnect must not
//     cancel the work it asked for (the upstream runs on, and its answer is
//     stored for the client's retry), but a hung upstream must not hold the
//     claim for ever either: once the client has been gone for one lease,
//     the work is cancelled.
//
// It checks every lease/leaseTicks, so a renewal comes between a third of
// the lease and a third plus a twelfth, and abandoned work is cancelled
// between one lease and one lease plus two twelfths after its client left.
// The goroutine runs only while requests do.
type leases struct {
	store   store.Store
	metrics *metrics
	logger  *zap.Logger
	lease   time.Duration
	tick    time.Duration

	mu      sync.Mutex
	head    *run // the running requests, a doubly linked list
	running bool // the goroutine is alive
}

const (
	leaseTicks    = 12
	minLeaseTick  = 5 * time.Millisecond
	minRenewRetry = 50 * time.Millisecond
	renewFraction = 3 // renew once lease/renewFraction has passed
)

// run is one request that holds a claim. Fields below mu are guarded by
// leases.mu.
type run struct {
	key    store.Key
	token  store.Token
	client context.Context    // the request's own context: done when the client leaves
	cancel context.CancelFunc // ends the work

	prev, next *run
	held       time.Time // when the claim lapses unless renewed
	claimedAt  time.Time // when it was last claimed or renewed
	goneAt     time.Time // when the client was first seen gone
	renewing   bool      // a renewal is in flight, or the claim is lost
	cancelled  bool
	done       bool
}

func newLeases(s store.Store, lease time.Duration, m *metrics, logger *zap.Logger) *leases {
	return &leases{store: s, metrics: m, logger: logger, lease: lease, tick: max(lease/leaseTicks, minLeaseTick)}
}

// start registers a request that has just claimed its key, and returns the
// context its work runs under: the request's values, without its
// cancellation. The caller must call stop when the work is over.
func (l *leases) start(client context.Context, key store.Key, tok store.Token) (*run, context.Context) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(client))
	now := time.Now()
	r := &run{key: key, token: tok, client: client, cancel: cancel, claimedAt: now, held: now.Add(l.lease)}
	l.mu.Lock()
	r.next = l.head
	if l.head != nil {
		l.head.prev = r
	}
	l.head = r
	if !l.running {
		l.running = true
		go l.watch()
	}
	l.mu.Unlock()
	return r, ctx
}

// stop unregisters r: no renewal starts after it returns, and one in flight
// is ignored. It cancels r's work context.
func (l *leases) stop(r *run) {
	l.mu.Lock()
	r.done = true
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	}
	r.prev, r.next = nil, nil
	l.mu.Unlock()
	r.cancel()
}

// watch checks the running requests every tick, and ends when none is left.
func (l *leases) watch() {
	t := time.NewTicker(l.tick)
	defer t.Stop()
	for now := range t.C {
		l.mu.Lock()
		if l.head == nil {
			l.running = false
			l.mu.Unlock()
			return
		}
		for r := l.head; r != nil; r = r.next {
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

// renew renews r's claim, retrying a failed renewal until the claim, held
// until held, lapses.
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
