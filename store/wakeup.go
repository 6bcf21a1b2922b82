package store

import (
	"context"
	"errors"
	"sync"
)

// Waiting duplicates (on_conflict wait) wait for the end of the claim they
// duplicate: its completion, release or purge. The handler signals the
// ends of its own claims, a Notifier those on other instances, through one
// process-wide broadcast, so that a waiter hears of the end whichever
// handler, config or instance held the claim.
var ends = &broadcast{watches: make(map[Key]*watch)}

// AwaitEnd returns a channel closed when SignalEnd(k) is next called in
// this process, and a function that withdraws the caller's interest. Call
// it before the store call that finds the claim running, or an end
// signalled between the two is missed.
func AwaitEnd(k Key) (ended <-chan struct{}, stop func()) { return ends.watch(k) }

// SignalEnd wakes every waiter on k in this process. A spurious wake-up is
// harmless: a waiter reads the store again. It is cheap when nobody waits.
func SignalEnd(k Key) { ends.done(k) }

// Awaited is the number of keys that waiters in this process await.
func Awaited() int {
	ends.mu.Lock()
	defer ends.mu.Unlock()
	return len(ends.watches)
}

// Notifier is implemented by shared stores that can tell this process when
// a claim ends on another instance, so that a waiter is woken at once
// instead of polling. A single-instance store needs none: the handler
// signals every end.
type Notifier interface {
	// Notify arranges for SignalEnd(k) to be called in this process when
	// k's current claim ends on any instance, and reports whether it is
	// still in progress (if not, nothing is arranged), atomically, so an
	// end cannot slip between; the caller calls AwaitEnd first. A claim
	// taken over is a new claim, to notify anew. An error means no wake-up
	// is promised: the caller polls the store instead.
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
