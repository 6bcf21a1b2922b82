package store

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// drainMargin is added to the longest lease of a replaced store's holds to
// bound how long it stays open after its Cleanup: it covers the last store
// calls of a request whose lease just ended, which each store bounds with
// its own timeouts (seconds at most). A variable for the tests.
var drainMargin = 5 * time.Second

// detachLinger is how long Detach keeps a store that a reload replaced
// open even when no request holds it: a request that the old server read
// just before it stopped may start after the Cleanup, and must find its
// store open when it takes its hold. A variable for the tests.
var detachLinger = time.Second

// Holds counts the requests that use one provisioned store, so that the
// store's shared backend (client, pool, file, table) outlives its Cleanup
// while they need it. Caddy cleans up the old config of a reload as soon
// as the new one runs, without waiting for the old config's requests; a
// reload that changes the store's options gives the new config another
// backend, and the old one would be closed under requests that still have
// to complete or release their claims. So Detach gives the backend back
// only once the last hold is given back, or once the longest lease of the
// holds plus drainMargin has passed since the Cleanup: a request that
// still runs then fares as after a crash (it can no longer renew its
// claim, which lapses), but a hung request cannot keep a backend open for
// ever.
//
// A request takes a hold before its first store call and gives it back
// when it is over; work it leaves to the background takes its own. The
// methods are safe on a nil *Holds (a store that does not register), and
// cost a request a few atomic operations and no allocation.
type Holds struct {
	n     atomic.Int64
	lease atomic.Int64 // the longest lease of any hold taken, in ns
	// detached is set by Detach; then the last Give runs release.
	detached atomic.Bool

	mu      sync.Mutex
	release func() // the deferred give-back; nil before Detach and once run
	timer   *time.Timer
}

// HoldsOf returns the holds of s, a registered store, or nil.
func HoldsOf(s Store) *Holds {
	registry.Lock()
	defer registry.Unlock()
	for _, list := range registry.stores {
		for _, e := range list {
			if e.Store == s {
				return e.holds
			}
		}
	}
	return nil
}

// Take notes a user of the store whose claim holds for lease.
func (h *Holds) Take(lease time.Duration) {
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

// Give undoes one Take; the last one after Detach gives the backend back.
func (h *Holds) Give() {
	if h == nil {
		return
	}
	if h.n.Add(-1) == 0 && h.detached.Load() {
		h.settle()
	}
}

// later arranges for release, which gives the backend back, to run once
// no hold is left, and at the latest after the longest lease plus
// drainMargin. A store that a reload replaced lingers too, at least
// detachLinger: the linger is a hold of its own. It reports false, and
// keeps nothing, if no hold is left and none lingers: the caller gives the
// backend back at once.
func (h *Holds) later(release func(), replaced bool) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.detached.Store(true)
	if replaced {
		h.n.Add(1)
		time.AfterFunc(detachLinger, h.Give)
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

// runLocked runs the release once, outside h.mu, which it unlocks.
func (h *Holds) runLocked() {
	release := h.release
	h.release = nil
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	h.mu.Unlock()
	if release != nil {
		release()
	}
}

// closeLater is how Detach gives back the pool entry at key of a store
// that holds remain on: with the last of them, logging what closing said.
func closeLater(h *Holds, replaced bool, name string, pool usagePool, key string) bool {
	return h.later(func() {
		if _, err := pool.Delete(key); err != nil {
			caddy.Log().Named("idempotency.store").Error("closing a store replaced by a reload",
				zap.String("store", name), zap.Error(err))
		}
	}, replaced)
}
