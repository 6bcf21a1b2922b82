package memory

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestSharedAcrossReloads(t *testing.T) {
	a := storetest.Provision(t, &Memory{MaxEntries: 7})
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	if got, _ := a.Acquire(context.Background(), k, c); got.Record != nil {
		t.Fatal("claim failed")
	}
	// A reload provisions a new module before the old one is cleaned up.
	b := storetest.Provision(t, &Memory{MaxEntries: 7})
	a.Cleanup()
	a.Cleanup() // idempotent
	if got, _ := b.Acquire(context.Background(), k, &store.Claim{Lease: time.Minute}); got.Record == nil || got.Record.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v", got.Record)
	}
}

// acquire claims a new key for a claim on endpoint, failing t if it cannot.
func acquire(t *testing.T, m *Memory, endpoint string) (store.Key, *store.Claim) {
	t.Helper()
	k := storetest.NewKey()
	c := &store.Claim{Token: storetest.NewToken(), Endpoint: endpoint, Fingerprint: store.Fingerprint{7}, CreatedAt: time.Now(), Lease: time.Minute}
	if got, err := m.Acquire(context.Background(), k, c); got.Record != nil || err != nil {
		t.Fatalf("Acquire = %v, %v", got.Record, err)
	}
	return k, c
}

// After many completions of different sizes, with claims among them, the
// eviction list holds exactly the completed records in completion order,
// the byte count is the sum of what the entries account for, and no claim
// was evicted.
func TestEvictionOrderAndAccounting(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 50, MaxBytes: 40_000})
	ctx := context.Background()
	var completed []store.Key // in completion order
	var claims []store.Key
	for i := range 400 {
		k, c := acquire(t, m, "POST /orders/"+strconv.Itoa(i))
		if i%40 == 0 {
			claims = append(claims, k) // left in flight
			continue
		}
		rec := &store.Response{Status: 201, Body: make([]byte, i%7*100), Header: http.Header{"X-N": {strconv.Itoa(i)}}}
		if err := m.Complete(ctx, k, c, rec, time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
		completed = append(completed, k)
	}

	tab := m.tab
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	inProgress := 0
	for e := range tab.All() {
		if cap(e.Blob) != len(e.Blob) {
			t.Fatalf("blob of %d bytes has capacity %d", len(e.Blob), cap(e.Blob))
		}
		if e.Blob.State() == store.InProgress {
			inProgress++
		}
	}
	if tab.Len() > 50 || tab.Bytes() > 40_000 {
		t.Fatalf("%d entries of %d bytes, over the bounds", tab.Len(), tab.Bytes())
	}
	for _, k := range claims {
		if e := tab.Lookup(k); e == nil || e.Blob.State() != store.InProgress {
			t.Fatal("a claim in flight was evicted")
		}
	}

	// The list is the newest completions in order.
	var listed []store.Key
	for e := range tab.Evictable() {
		listed = append(listed, e.Key)
	}
	if len(listed)+inProgress != tab.Len() {
		t.Fatalf("%d records listed and %d claims, but %d entries", len(listed), inProgress, tab.Len())
	}
	want := completed[len(completed)-len(listed):]
	for i := range listed {
		if listed[i] != want[i] {
			t.Fatalf("eviction list position %d holds the wrong record: not oldest first", i)
		}
	}
}

func TestBoundedEntriesEvictsOldestCompleted(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 3, MaxBytes: 1 << 30})
	ctx := context.Background()
	keys := make([]store.Key, 4)
	for i := range keys {
		keys[i] = storetest.NewKey()
		c := &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
		if _, err := m.Acquire(ctx, keys[i], c); err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		if err := m.Complete(ctx, keys[i], c, &store.Response{Status: 200}, time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
	}
	if n := m.tab.Len(); n != 3 {
		t.Fatalf("%d entries kept, want the bound of 3", n)
	}
	if m.tab.Lookup(keys[0]) != nil {
		t.Fatal("the oldest completed record was not the one evicted")
	}
}

func TestFullOfClaimsFailsInsteadOfEvicting(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 2, MaxBytes: 1 << 30})
	ctx := context.Background()
	for range 2 {
		if _, err := m.Acquire(ctx, storetest.NewKey(), &store.Claim{Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Acquire(ctx, storetest.NewKey(), &store.Claim{Lease: time.Minute})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire on a table full of claims = %v, want ErrUnavailable", err)
	}
}

func TestBoundedBytes(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 1000, MaxBytes: 10_000})
	ctx := context.Background()
	for range 20 {
		k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
		if _, err := m.Acquire(ctx, k, c); err != nil {
			t.Fatal(err)
		}
		if err := m.Complete(ctx, k, c, &store.Response{Status: 200, Body: make([]byte, 2000)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if m.tab.Bytes() > 10_000 {
			t.Fatalf("table holds %d bytes, over its bound of 10000", m.tab.Bytes())
		}
	}
}

func TestSweepDropsExpired(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 50})
	ctx := context.Background()
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	m.Acquire(ctx, k, c)
	m.Complete(ctx, k, c, &store.Response{Status: 200, Body: []byte("x")}, time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	m.tab.Lock()
	e := m.tab.Live(k, now().UnixNano())
	n, b := m.tab.Len(), m.tab.Bytes()
	m.tab.Unlock()
	if e != nil || n != 0 || b != 0 {
		t.Fatalf("expired record still counted: entry %v, %d entries, %d bytes", e, n, b)
	}
}

// A reload that changes a table's limits keeps its records: the table is
// as large as the largest limits of the configs that use it, and shrinks
// to the new ones, evicting the oldest completed records, once the old
// config is cleaned up.
func TestReloadResizesTheTable(t *testing.T) {
	ctx := context.Background()
	old := storetest.Provision(t, &Memory{Name: "resized", MaxEntries: 10})
	var keys []store.Key
	for range 8 {
		k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
		if got, err := old.Acquire(ctx, k, c); got.Record != nil || err != nil {
			t.Fatal(got.Record, err)
		}
		if err := old.Complete(ctx, k, c, &store.Response{Status: 201}, time.Hour); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	replacement := storetest.Provision(t, &Memory{Name: "resized", MaxEntries: 5})
	kept := func() (n int) {
		for _, k := range keys {
			if rec, _, err := replacement.Lookup(ctx, k); err == nil && rec != nil {
				n++
			}
		}
		return n
	}
	if n := kept(); n != 8 {
		t.Fatalf("the new config sees %d of the 8 records while the old one lives, want all", n)
	}
	old.Cleanup()
	if n := kept(); n != 5 {
		t.Fatalf("after the old config's cleanup %d records are kept, want the new limit, 5", n)
	}
	if rec, _, _ := replacement.Lookup(ctx, keys[7]); rec == nil {
		t.Fatal("the newest record was evicted, want the oldest")
	}
}
