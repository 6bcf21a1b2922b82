package store

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// drainMargin, added to the longest lease of a replaced store's holds,
// bounds how long it stays open after its Cleanup: it covers the last
// calls of a request whose lease just ended. A variable for the tests.
var drainMargin = 5 * time.Second

// detachLinger is how long Detach keeps a store that a reload replaced open
// even when no request holds it: a request the old server read just before
// it stopped may take its hold after the Cleanup. A variable for the tests.
var detachLinger = time.Second

// Holds counts the requests that use one provisioned store, so that its
// shared backend outlives its Cleanup while they need it: Caddy cleans up
// the old config of a reload without waiting for its requests. Detach
// gives the backend back with the last hold, or once the longest lease
// plus drainMargin has passed, so that a hung request cannot keep it open.
//
// A request takes a hold before its first store call and gives it back
// when it is over; background work takes its own. The methods are safe on
// a nil *Holds.
type Holds struct {
	n     atomic.Int64
	lease atomic.Int64 // the longest lease of any hold taken, in ns
	// detached is set by Detach; then the last Done runs release.
	detached atomic.Bool
	// closed is set once the last user gave the backend back: it is closed.
	closed atomic.Bool

	mu      sync.Mutex
	release func() // the deferred give-back; nil before Detach and once run
	timer   *time.Timer
}

// HoldsOf returns the holds of s, a registered store, or nil.
func HoldsOf(s Store) *Holds {
	registry.Lock()
	defer registry.Unlock()
	e, _ := find(s)
	return e.holds
}

// Add notes a user of the store whose claim holds for lease.
func (h *Holds) Add(lease time.Duration) {
	if h == nil {
		return
	}
	h.n.Add(1)
	for {
		longest := h.lease.Load()
		if int64(lease) <= longest || h.lease.CompareAndSwap(longest, int64(lease)) {
			return
		}
	}
}

// Done undoes one Add; the last one after Detach gives the backend back.
func (h *Holds) Done() {
	if h == nil {
		return
	}
	if h.n.Add(-1) == 0 && h.detached.Load() {
		h.settle()
	}
}

// later arranges for release to run once no hold is left, and at the
// latest after the longest lease plus drainMargin. A store that a reload
// replaced lingers at least detachLinger, as a hold of its own. It reports
// false, keeping nothing, if no hold is left and none lingers: the caller
// gives the backend back at once.
func (h *Holds) later(release func(), replaced bool) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.detached.Store(true)
	if replaced {
		h.n.Add(1)
		time.AfterFunc(detachLinger, h.Done)
	} else if h.n.Load() == 0 {
		return false
	}
	h.release = release
	h.timer = time.AfterFunc(max(time.Duration(h.lease.Load()), detachLinger)+drainMargin, h.expire)
	return true
}

// settle runs the release if no hold is left.
func (h *Holds) settle() {
	h.mu.Lock()
	if h.n.Load() > 0 {
		h.mu.Unlock()
		return
	}
	h.runLocked()
}

// expire runs the release whatever holds are left: their leases passed.
func (h *Holds) expire() {
	h.mu.Lock()
	h.runLocked()
}

// Closed reports whether the store's backend was closed, after a reload
// replaced it: its calls fail from then on. False on a nil *Holds.
func (h *Holds) Closed() bool { return h != nil && h.closed.Load() }

// runLocked runs the release once, outside h.mu, which it unlocks, in a
// goroutine of its own: the last Done is a request's, which must not wait
// for a pool to close its connections.
func (h *Holds) runLocked() {
	release := h.release
	h.release = nil
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	h.mu.Unlock()
	if release != nil {
		go release()
	}
}

// closeLater gives back the pool entry at key with the last hold.
func closeLater(h *Holds, replaced bool, name string, pool usagePool, key string) bool {
	return h.later(func() {
		deleted, err := pool.Delete(key)
		h.closed.Store(deleted)
		if err != nil {
			caddy.Log().Named("idempotency.store").Error("closing a store replaced by a reload",
				zap.String("store", name), zap.Error(err))
		}
	}, replaced)
}
