// Package tier is the local tier of a shared store: an in-process copy of
// the completed records it also keeps elsewhere (Redis, PostgreSQL), so
// that their replays cost no round trip, and the Tiers that one channel of
// the store's subscription keeps coherent.
package tier

import (
	"math"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

// now is replaceable in tests.
var now = time.Now

// Cache is the memory store's table put to another use: an in-process copy
// of completed records that a shared store also keeps elsewhere, so that
// their replays cost no round trip. A completed record never changes until
// it expires or is purged, so a copy stays right until its own expiry,
// which the record carries (store.Encoded.ExpiresAt), provided the cache
// hears of every purge.
//
// It holds completed records only, never a claim, at most maxBytes of them
// (each counted with the same overhead as in the memory store), evicting
// the oldest first, and drops each when it expires.
//
// A purge can race with a read from the backing store: a record read
// before the purge must not be put after the purge's Delete. So Put
// takes the Version read before the backing store was, and refuses the
// record if any Delete, Suspend or Resume came in between.
type Cache struct {
	t *table.Table
	// version and suspended are guarded by t's lock.
	version   uint64
	suspended bool
}

// NewCache returns an empty cache of at most maxBytes, suspended: it
// serves and takes nothing until Resume.
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

// Version is to be read before the backing store, and given to Put with
// what that read returned.
func (c *Cache) Version() uint64 {
	c.t.Lock()
	defer c.t.Unlock()
	return c.version
}

// Put keeps blob, k's completed record, until the expiry it carries, and
// reports whether it did. It does not when the cache changed since version
// was read (a purge or a suspension came in between), when it is
// suspended, when blob is not a completed record with an expiry still to
// come, or when it is larger than the whole cache. The cache keeps blob
// itself: the caller must not write to it afterwards.
func (c *Cache) Put(k store.Key, blob store.Encoded, version uint64) bool {
	if blob.State() != store.Completed {
		return false
	}
	expires := blob.ExpiresAt()
	if expires.IsZero() {
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

// Suspend drops every record and serves nothing until Resume: for a cache
// that may have missed a purge.
func (c *Cache) Suspend() {
	t := c.t
	t.Lock()
	defer t.Unlock()
	c.version++
	c.suspended = true
	t.Clear()
}

// Resume serves and takes records again, those read since alone: a read
// that began while the cache was suspended may predate a purge it missed.
func (c *Cache) Resume() {
	t := c.t
	t.Lock()
	defer t.Unlock()
	c.version++
	c.suspended = false
}
