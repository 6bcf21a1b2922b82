package memory

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// pointers counts the words of t that the GC must scan.
func pointers(t reflect.Type) int {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.String, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return 1
	case reflect.Interface:
		return 2
	case reflect.Array:
		return t.Len() * pointers(t.Elem())
	case reflect.Struct:
		n := 0
		for i := range t.NumField() {
			n += pointers(t.Field(i).Type)
		}
		return n
	}
	return 0
}

// The point of the entry's layout: per record the GC follows the blob,
// which it does not scan, and the two list links. A time.Time, a string or
// a header map here would bring back a pointer chase per record per cycle.
func TestEntryIsNearlyPointerFree(t *testing.T) {
	if n := pointers(reflect.TypeFor[entry]()); n != 3 {
		t.Fatalf("entry holds %d pointers, want 3 (blob, prev, next)", n)
	}
	if pointers(reflect.TypeFor[entry]().Field(1).Type.Elem()) != 0 {
		t.Fatal("the blob's elements hold pointers")
	}
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
		rec := &store.Record{Status: 201, Body: make([]byte, i%7*100), Header: http.Header{"X-N": {strconv.Itoa(i)}}}
		if err := m.Complete(ctx, k, c, rec, time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
		completed = append(completed, k)
	}

	tab := m.tab
	var bytes int64
	inProgress := 0
	for k, e := range tab.entries {
		if e.key != k {
			t.Fatalf("entry under %v has key %v", k, e.key)
		}
		if e.size != int64(len(e.blob)+entryOverhead) {
			t.Fatalf("entry accounts %d bytes for a %d-byte blob", e.size, len(e.blob))
		}
		if cap(e.blob) != len(e.blob) {
			t.Fatalf("blob of %d bytes has capacity %d", len(e.blob), cap(e.blob))
		}
		bytes += e.size
		if e.blob.State() == store.InProgress {
			inProgress++
		}
	}
	if bytes != tab.bytes {
		t.Fatalf("table counts %d bytes, its entries %d", tab.bytes, bytes)
	}
	if len(tab.entries) > 50 || tab.bytes > 40_000 {
		t.Fatalf("%d entries of %d bytes, over the bounds", len(tab.entries), tab.bytes)
	}
	for _, k := range claims {
		if e := tab.entries[k]; e == nil || e.blob.State() != store.InProgress {
			t.Fatal("a claim in flight was evicted")
		}
	}

	// The list, walked both ways, is the newest completions in order.
	var listed []store.Key
	for e := tab.oldest; e != nil; e = e.next {
		if e.next == nil && e != tab.newest || e.next != nil && e.next.prev != e {
			t.Fatal("the eviction list's links disagree")
		}
		listed = append(listed, e.key)
	}
	if len(listed)+inProgress != len(tab.entries) {
		t.Fatalf("%d records listed and %d claims, but %d entries", len(listed), inProgress, len(tab.entries))
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
		if err := m.Complete(ctx, keys[i], c, &store.Record{Status: 200}, time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
	}
	if n := len(m.tab.entries); n != 3 {
		t.Fatalf("%d entries kept, want the bound of 3", n)
	}
	if _, ok := m.tab.entries[keys[0]]; ok {
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
		if err := m.Complete(ctx, k, c, &store.Record{Status: 200, Body: make([]byte, 2000)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if m.tab.bytes > 10_000 {
			t.Fatalf("table holds %d bytes, over its bound of 10000", m.tab.bytes)
		}
	}
}

func TestSweepDropsExpired(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 50})
	ctx := context.Background()
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	m.Acquire(ctx, k, c)
	m.Complete(ctx, k, c, &store.Record{Status: 200, Body: []byte("x")}, time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	m.tab.mu.Lock()
	e := m.tab.live(k, now().UnixNano())
	n, b := len(m.tab.entries), m.tab.bytes
	m.tab.mu.Unlock()
	if e != nil || n != 0 || b != 0 {
		t.Fatalf("expired record still counted: entry %v, %d entries, %d bytes", e, n, b)
	}
}
