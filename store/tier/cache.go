// Package tier is the local tier of a shared store (Redis, PostgreSQL): an
// in-process copy of its completed records, so that their replays cost no
// round trip, and the Tiers that one subscription keeps coherent.
package tier

import (
	"math"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

// now is replaceable in tests.
var now = time.Now

// Cache is a local tier of completed records, at most maxBytes, oldest
// evicted first. A completed record never changes until it expires or is
// purged, so a copy stays right provided the cache hears of every purge.
//
// A record read before a purge must not be put after the purge's Delete:
// Put takes the Version read before the backing store was, and refuses the
// record if any Delete, Suspend or Resume came in between.
type Cache struct {
	t *table.Table
	// version and suspended are guarded by t's lock.
	version   uint64
	suspended bool
}

// NewCache returns an empty cache of at most maxBytes, suspended until
// Resume.
func NewCache(maxBytes int64) *Cache {
	return &Cache{t: table.New(math.MaxInt, maxBytes), suspended: true}
}

// Destruct stops the cache's background sweep of expired records.
func (c *Cache) Destruct() error { return c.t.Destruct() }

// Get returns k's record if the cache holds it unexpired and is not
// suspended; nil otherwise. The bytes are shared: never write to them.
func (c *Cache) Get(k store.Key) store.Encoded {
	t := c.t
	t.Lock()
	defer t.Unlock()
	if c.suspended {
		return nil
	}
	if e := t.Live(k, now().UnixNano()); e != nil {
		return e.Blob
	}
	return nil
}

// Version is to be read before the backing store, for Put.
func (c *Cache) Version() uint64 {
	c.t.Lock()
	defer c.t.Unlock()
	return c.version
}

// Put keeps blob, k's completed record, until the expiry it carries, and
// reports whether it did: not if the cache changed since version was read
// or is suspended, if blob is not a completed record with an expiry to
// come, or if it is larger than the cache. The caller must not write to
// blob afterwards.
func (c *Cache) Put(k store.Key, blob store.Encoded, version uint64) bool {
	expires := blob.ExpiresAt()
	if blob.State() != store.Completed || expires.IsZero() {
		return false
	}
	size := table.Size(blob)
	t := c.t
	t.Lock()
	defer t.Unlock()
	n := now().UnixNano()
	if c.suspended || version != c.version || n >= expires.UnixNano() || size > t.MaxBytes() {
		return false
	}
	if e := t.Lookup(k); e != nil {
		t.Remove(e)
	}
	if err := t.MakeRoom(size); err != nil {
		return false // cannot happen: every entry is completed, hence evictable
	}
	t.Insert(k, blob, expires.UnixNano())
	return true
}

// Delete drops k's record, and refuses the Put of any record read before.
func (c *Cache) Delete(k store.Key) {
	t := c.t
	t.Lock()
	defer t.Unlock()
	c.version++
	if e := t.Lookup(k); e != nil {
		t.Remove(e)
	}
}

// Suspend drops every record and serves nothing until Resume.
func (c *Cache) Suspend() {
	c.t.Lock()
	defer c.t.Unlock()
	c.version++
	c.suspended = true
	c.t.Clear()
}

// Resume serves and takes records again, only those read since: an older
// read may predate a purge the cache missed.
func (c *Cache) Resume() {
	c.t.Lock()
	defer c.t.Unlock()
	c.version++
	c.suspended = false
}
