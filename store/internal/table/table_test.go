package table

import (
	"errors"
	"reflect"
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
	if n := pointers(reflect.TypeFor[Entry]()); n != 3 {
		t.Fatalf("entry holds %d pointers, want 3 (blob, prev, next)", n)
	}
	if pointers(reflect.TypeFor[Entry]().Field(1).Type.Elem()) != 0 {
		t.Fatal("the blob's elements hold pointers")
	}
}

func newTable(t *testing.T, maxEntries int, maxBytes int64) *Table {
	tab := New(maxEntries, maxBytes)
	t.Cleanup(func() { tab.Destruct() })
	return tab
}

func claimEntry() *Entry {
	blob := store.AppendClaim(nil, &store.Claim{Token: storetest.NewToken()}, time.Now())
	return &Entry{Key: storetest.NewKey(), Blob: blob, Expires: time.Now().Add(time.Hour).UnixNano()}
}

func completedEntry(size int) *Entry {
	blob := store.AppendCompleted(nil, &store.Claim{Token: storetest.NewToken()}, &store.Record{Status: 201, Body: make([]byte, size)})
	return &Entry{Key: storetest.NewKey(), Blob: blob, Expires: time.Now().Add(time.Hour).UnixNano()}
}

// put makes room for e and inserts it, as the stores do.
func put(t *Table, e *Entry) error {
	if err := t.MakeRoom(Size(e.Blob)); err != nil {
		return err
	}
	t.Insert(e)
	return nil
}

// MakeRoom evicts completed entries oldest first and never a claim; the
// counts and the list stay right through inserts, evictions and removals.
func TestMakeRoomEvictsOldestCompletedOnly(t *testing.T) {
	tab := newTable(t, 5, 1<<20)
	tab.Lock()
	defer tab.Unlock()
	claim := claimEntry()
	var completed []*Entry
	if err := put(tab, claim); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e := completedEntry(i * 10)
		if err := put(tab, e); err != nil {
			t.Fatal(err)
		}
		completed = append(completed, e)
		if err := tab.Check(); err != nil {
			t.Fatalf("after insert %d: %v", i, err)
		}
	}
	tab.Remove(completed[7]) // from the middle of the list
	if err := tab.Check(); err != nil {
		t.Fatalf("after a removal: %v", err)
	}
	var listed []*Entry
	for e := range tab.Evictable() {
		listed = append(listed, e)
	}
	want := []*Entry{completed[6], completed[8], completed[9]}
	if !reflect.DeepEqual(listed, want) || tab.Lookup(claim.Key) != claim || tab.Len() != 4 {
		t.Fatalf("listed %d entries, %d in the table; want the 3 newest completed and the claim", len(listed), tab.Len())
	}

	full := newTable(t, 2, 1<<20)
	full.Lock()
	defer full.Unlock()
	put(full, claimEntry())
	put(full, claimEntry())
	if err := put(full, completedEntry(1)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("MakeRoom in a table full of claims = %v, want ErrUnavailable", err)
	}
}

// Check finds each kind of broken bookkeeping.
func TestCheckFindsBrokenBookkeeping(t *testing.T) {
	for name, breakIt := range map[string]func(*Table){
		"bytes":        func(tab *Table) { tab.bytes++ },
		"size":         func(tab *Table) { tab.oldest.size++ },
		"key":          func(tab *Table) { tab.oldest.Key[0]++ },
		"back link":    func(tab *Table) { tab.newest.prev = nil },
		"newest":       func(tab *Table) { tab.newest = tab.oldest },
		"cycle":        func(tab *Table) { tab.newest.next = tab.oldest },
		"unlisted":     func(tab *Table) { tab.unlink(tab.newest) },
		"stray listed": func(tab *Table) { delete(tab.entries, tab.oldest.Key); tab.bytes -= tab.oldest.size },
	} {
		tab := newTable(t, 10, 1<<20)
		for _, e := range []*Entry{completedEntry(1), claimEntry(), completedEntry(2), completedEntry(3)} {
			put(tab, e)
		}
		if err := tab.Check(); err != nil {
			t.Fatalf("%s: a sound table: %v", name, err)
		}
		breakIt(tab)
		if tab.Check() == nil {
			t.Errorf("Check passed a table with a broken %s", name)
		}
	}
}
