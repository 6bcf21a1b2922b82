package tier

import (
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Tiers are the local tiers (Caches) that one channel of a shared store's
// subscription keeps coherent: the Redis store's per key prefix, the
// PostgreSQL store's per table. There is one tier per size, shared by the
// stores that ask for it (those of one config, or of the old and new
// configs during a reload). They serve only while the channel is live:
// a tier that may have missed a purge must serve nothing. The zero value
// is a channel not yet live, without tiers.
type Tiers struct {
	mu     sync.Mutex
	live   bool
	caches map[int64]*sharedCache
}

type sharedCache struct {
	*Cache
	users int
}

// Join returns the tier of size bytes, making it if none of that size
// exists yet; nil if size is not positive.
func (ts *Tiers) Join(size int64) *Cache {
	if size <= 0 {
		return nil
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	sc := ts.caches[size]
	if sc == nil {
		sc = &sharedCache{Cache: NewCache(size)}
		if ts.live {
			sc.Resume()
		}
		if ts.caches == nil {
			ts.caches = make(map[int64]*sharedCache)
		}
		ts.caches[size] = sc
	}
	sc.users++
	return sc.Cache
}

// Leave undoes Join. The last store to leave a tier suspends and destroys
// it: requests of the old config that are still finishing may read it,
// and a tier that no longer hears of purges must serve nothing.
func (ts *Tiers) Leave(size int64) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	sc := ts.caches[size]
	if sc == nil {
		return
	}
	if sc.users--; sc.users == 0 {
		delete(ts.caches, size)
		sc.Suspend()
		sc.Destruct()
	}
}

// Live reports whether the channel is live: subscribed on a connection
// that has not failed since.
func (ts *Tiers) Live() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.live
}

// Resume marks the channel live, and its tiers serve again.
func (ts *Tiers) Resume() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.live = true
	for _, sc := range ts.caches {
		sc.Resume()
	}
}

// Suspend marks the channel down, and its tiers are emptied and serve
// nothing until Resume.
func (ts *Tiers) Suspend() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.live = false
	for _, sc := range ts.caches {
		sc.Suspend()
	}
}

// Evict drops k's record from every tier: it was purged.
func (ts *Tiers) Evict(k store.Key) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, sc := range ts.caches {
		sc.Delete(k)
	}
}
