package tier

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func newCache(t *testing.T, maxBytes int64) *Cache {
	c := NewCache(maxBytes)
	t.Cleanup(func() { c.Destruct() })
	c.Resume()
	return c
}

// completedBlob is a completed record with a body of size bytes, expiring
// at expires.
func completedBlob(size int, expires time.Time) store.Encoded {
	return store.AppendCompleted(nil, &store.Claim{Token: storetest.NewToken(), Endpoint: "POST h/p"},
		&store.Response{Status: 201, Body: make([]byte, size)}, expires)
}

func TestCacheKeepsCompletedRecordsWithAnExpiry(t *testing.T) {
	c := newCache(t, 1<<20)
	later := time.Now().Add(time.Hour)
	k := storetest.NewKey()
	blob := completedBlob(10, later)
	if !c.Put(k, blob, c.Version()) {
		t.Fatal("Put of a completed record refused")
	}
	if got := c.Get(k); string(got) != string(blob) {
		t.Fatalf("Get = %x, want %x", got, blob)
	}

	claim := store.AppendClaim(nil, &store.Claim{Token: storetest.NewToken(), CreatedAt: time.Now()})
	noExpiry := store.AppendCompleted(nil, &store.Claim{}, &store.Response{Status: 200}, time.Time{})
	past := completedBlob(1, time.Now().Add(-time.Second))
	for name, b := range map[string]store.Encoded{"a claim": claim, "a record without expiry": noExpiry, "an expired record": past} {
		k := storetest.NewKey()
		if c.Put(k, b, c.Version()) || c.Get(k) != nil {
			t.Errorf("%s was cached", name)
		}
	}
}

func TestCacheHonoursEachExpiry(t *testing.T) {
	c := newCache(t, 1<<20)
	start := time.Now()
	soon, later := storetest.NewKey(), storetest.NewKey()
	c.Put(soon, completedBlob(1, start.Add(time.Minute)), c.Version())
	c.Put(later, completedBlob(1, start.Add(time.Hour)), c.Version())
	now = func() time.Time { return start.Add(2 * time.Minute) }
	t.Cleanup(func() { now = time.Now })
	if c.Get(soon) != nil {
		t.Error("a record past its expiry was served")
	}
	if c.Get(later) == nil {
		t.Error("a record before its expiry was not served")
	}
}

func TestCacheIsBoundedByBytesAndEvictsTheOldest(t *testing.T) {
	const max = 10_000
	c := newCache(t, max)
	later := time.Now().Add(time.Hour)
	var keys []store.Key
	for range 20 {
		k := storetest.NewKey()
		if !c.Put(k, completedBlob(2000, later), c.Version()) {
			t.Fatal("Put refused")
		}
		keys = append(keys, k)
		if c.t.Bytes() > max {
			t.Fatalf("cache holds %d bytes, over its bound of %d", c.t.Bytes(), max)
		}
		if err := c.t.Check(); err != nil {
			t.Fatal(err)
		}
	}
	kept := 0
	for i, k := range keys {
		if c.Get(k) != nil {
			kept++
			if i < len(keys)-4 {
				t.Errorf("record %d of %d kept while newer ones were evicted", i, len(keys))
			}
		}
	}
	if kept == 0 || kept > 4 {
		t.Fatalf("%d records of 2000 bytes kept in %d bytes", kept, max)
	}

	// A record larger than the whole cache is refused and evicts nothing.
	if c.Put(storetest.NewKey(), completedBlob(max, later), c.Version()) {
		t.Fatal("a record larger than the cache was put")
	}
	if c.Get(keys[len(keys)-1]) == nil {
		t.Fatal("a refused oversized record evicted others")
	}
}

func TestCachePutAgainReplaces(t *testing.T) {
	c := newCache(t, 1<<20)
	k, later := storetest.NewKey(), time.Now().Add(time.Hour)
	c.Put(k, completedBlob(100, later), c.Version())
	c.Put(k, completedBlob(100, later), c.Version())
	if c.t.Len() != 1 || c.t.Bytes() != table.Size(completedBlob(100, later)) {
		t.Fatalf("two puts of one key hold %d entries, %d bytes", c.t.Len(), c.t.Bytes())
	}
	if err := c.t.Check(); err != nil {
		t.Fatal(err)
	}
}

// A record read from the backing store before a purge must not be put
// after the purge evicted the key.
func TestCacheRefusesARecordReadBeforeAPurge(t *testing.T) {
	c := newCache(t, 1<<20)
	k, later := storetest.NewKey(), time.Now().Add(time.Hour)
	v := c.Version()
	c.Delete(k) // the purge's message arrives while the read is under way
	if c.Put(k, completedBlob(1, later), v) || c.Get(k) != nil {
		t.Fatal("a record read before a purge was cached after it")
	}
	c.Put(k, completedBlob(1, later), c.Version())
	c.Delete(k)
	if c.Get(k) != nil {
		t.Fatal("Delete left the record")
	}
}

func TestCacheSuspendedServesAndTakesNothing(t *testing.T) {
	later := time.Now().Add(time.Hour)
	fresh := NewCache(1 << 20)
	t.Cleanup(func() { fresh.Destruct() })
	if fresh.Put(storetest.NewKey(), completedBlob(1, later), fresh.Version()) {
		t.Fatal("a new cache took a record before Resume")
	}

	c := newCache(t, 1<<20)
	k := storetest.NewKey()
	c.Put(k, completedBlob(1, later), c.Version())
	c.Suspend()
	if c.Get(k) != nil || c.t.Bytes() != 0 || c.t.Len() != 0 {
		t.Fatal("Suspend kept records")
	}
	v := c.Version() // a read that begins while suspended
	if c.Put(k, completedBlob(1, later), v) {
		t.Fatal("a suspended cache took a record")
	}
	c.Resume()
	if c.Put(k, completedBlob(1, later), v) {
		t.Fatal("a record read while suspended was taken after Resume")
	}
	if !c.Put(k, completedBlob(1, later), c.Version()) || c.Get(k) == nil {
		t.Fatal("a resumed cache does not take records read since")
	}
}
