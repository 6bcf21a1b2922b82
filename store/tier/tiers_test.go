package tier

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// The tiers of a channel serve only while it is live, are shared by size,
// and are emptied by a loss of the channel and by a purge.
func TestTiers(t *testing.T) {
	var ts Tiers
	if ts.Join(0) != nil {
		t.Fatal("a tier of size 0")
	}
	a, b, other := ts.Join(1<<20), ts.Join(1<<20), ts.Join(2<<20)
	if a != b || a == other {
		t.Fatal("tiers are not shared by size")
	}
	k, purged := storetest.NewKey(), storetest.NewKey()
	blob := completedBlob(10, time.Now().Add(time.Hour))
	put := func(c *Cache, k store.Key) bool { return c.Put(k, blob, c.Version()) }
	if put(a, k) || ts.Live() {
		t.Fatal("a tier took a record before its channel was live")
	}
	ts.Resume()
	if !put(a, k) || !put(a, purged) || !put(other, purged) {
		t.Fatal("a live tier refused a record")
	}
	ts.Evict(purged)
	if a.Get(purged) != nil || other.Get(purged) != nil || a.Get(k) == nil {
		t.Fatal("Evict did not drop the purged record alone from every tier")
	}
	ts.Suspend()
	if a.Get(k) != nil || put(a, k) {
		t.Fatal("a suspended tier served or took a record")
	}
	ts.Resume()
	if a.Get(k) != nil {
		t.Fatal("a record kept before the suspension came back")
	}

	ts.Leave(1 << 20)
	if !put(a, k) {
		t.Fatal("a tier that one store still uses stopped serving")
	}
	ts.Leave(1 << 20)
	if a.Get(k) != nil || put(a, k) {
		t.Fatal("a tier that every store left still serves")
	}
	ts.Leave(2 << 20)
	ts.Leave(4 << 20) // never joined
}
