package tier

import (
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Tiers are the local tiers that one channel of a shared store's
// subscription keeps coherent (per Redis key prefix, per PostgreSQL
// table): one per size, shared by the stores that ask for it. They serve
// only while the channel is live, since a tier that may have missed a
// purge must serve nothing. The zero value is not live, without tiers.
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

// Leave undoes Join. The last store to leave a tier suspends it, since
// requests still finishing may read it, and destroys it.
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
func (ts *Tiers) Resume() { ts.setLive(true, (*Cache).Resume) }

// Suspend marks the channel down, emptying its tiers until Resume.
func (ts *Tiers) Suspend() { ts.setLive(false, (*Cache).Suspend) }

func (ts *Tiers) setLive(live bool, each func(*Cache)) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.live = live
	for _, sc := range ts.caches {
		each(sc.Cache)
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
