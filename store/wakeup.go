package store

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Waiting duplicates (the handler's on_conflict wait) wait for the end of
// the claim they duplicate: its completion, its release, or a purge. The
// handler signals the end of the claims it holds itself; a store that hears
// of ends on other instances (a Notifier) signals those. Both go through
// one process-wide broadcast, so that a waiter hears of the end whichever
// handler, config or instance held the claim.
var ends = &broadcast{watches: make(map[Key]*watch)}

// AwaitEnd returns a channel closed when SignalEnd(k) is next called in
// this process, and a function that withdraws the caller's interest, so
// that the watches of claims that end elsewhere unheard do not pile up.
// Call it before the store call that finds the claim still running: an end
// signalled between the two would otherwise be missed.
func AwaitEnd(k Key) (ended <-chan struct{}, stop func()) { return ends.watch(k) }

// SignalEnd wakes every waiter on k in this process. A spurious wake-up is
// harmless: a waiter reads the store again and waits on if the claim still
// runs. It is cheap when nobody waits: a map lookup under a lock held for
// nanoseconds.
func SignalEnd(k Key) { ends.done(k) }

// Awaited is the number of keys that waiters in this process await.
func Awaited() int {
	ends.mu.Lock()
	defer ends.mu.Unlock()
	return len(ends.watches)
}

// Notifier is implemented by stores shared by several instances that can
// tell this process when a claim ends on another one (Redis Pub/Sub,
// PostgreSQL LISTEN/NOTIFY), so that a waiter there is woken at once
// instead of polling. A single-instance store needs no Notifier: every
// claim ends in its own process, where the handler signals it.
type Notifier interface {
	// Notify arranges for SignalEnd(k) to be called in this process when
	// k's current claim ends on any instance (completed, released or
	// purged), and reports whether the claim is still in progress. When
	// it is not (it ended before Notify ran), nothing is arranged and the
	// caller reads the record at once. Notify checks the claim and
	// arranges the wake-up atomically, so an end cannot slip between
	// them; the caller calls AwaitEnd first. A claim taken over after its
	// owner died is a new claim, to notify anew.
	//
	// ErrNotListening, or any other error, means that no wake-up can be
	// promised now: the caller polls the store instead.
	Notify(ctx context.Context, k Key) (inProgress bool, err error)
}

// ErrNotListening is returned by Notify while the store's subscription to
// the other instances' notifications is down or not yet established.
var ErrNotListening = errors.New("not listening to the store's notifications")

// broadcast holds the waiters of each key; the one instance is ends.
type broadcast struct {
	mu      sync.Mutex
	watches map[Key]*watch
}

type watch struct {
	ch      chan struct{}
	waiters int
}

func (b *broadcast) watch(k Key) (<-chan struct{}, func()) {
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

func (b *broadcast) done(k Key) {
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

// subscriptionLosses counts, per store (by name), the subscriptions to
// other instances' notifications that dropped. It is process-wide, like the
// subscriptions, and registered into each config's registry.
var subscriptionLosses = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "idempotency", Name: "store_subscription_losses_total",
	Help: "Subscriptions to other instances' notifications (wake-ups of waiting duplicates, purges) that dropped and had to be re-established, by store.",
}, []string{"store"})

// SubscriptionLosses registers the loss counter into reg, tolerating a
// registration by an earlier config, and returns it; its label is the
// name of a store the lost subscription served. A nil reg registers
// nothing.
func SubscriptionLosses(reg *prometheus.Registry) (*prometheus.CounterVec, error) {
	if reg != nil {
		if err := reg.Register(subscriptionLosses); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, err
		}
	}
	return subscriptionLosses, nil
}
