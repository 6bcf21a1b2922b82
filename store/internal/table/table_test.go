package table

import (
	"bytes"
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

// Replace completes a claim where it stands: in a table at its entry limit
// nothing is evicted for it, a blob that needs bytes evicts the oldest
// completed entries, and one that cannot fit takes the claim out of the
// table, as Remove, MakeRoom and Insert did.
func TestReplaceCompletesInPlace(t *testing.T) {
	tab := newTable(t, 3, 1<<20)
	tab.Lock()
	defer tab.Unlock()
	old, claim, newer := completedEntry(1), claimEntry(), completedEntry(2)
	for _, e := range []*Entry{old, claim, newer} {
		if err := put(tab, e); err != nil {
			t.Fatal(err)
		}
	}
	done := completedEntry(3).Blob
	if err := tab.Replace(claim, done, 42); err != nil {
		t.Fatal(err)
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	if tab.Len() != 3 || tab.newest != claim || tab.Lookup(old.Key) != old || claim.Expires != 42 || !bytes.Equal(claim.Blob, done) {
		t.Fatalf("a replace at the entry limit: %d entries, want 3 with the claim newest and nothing evicted", tab.Len())
	}

	// room for the claim and one small record, or the big one alone
	tight := newTable(t, 10, Size(completedEntry(300).Blob)+Size(completedEntry(1).Blob)-1)
	tight.Lock()
	defer tight.Unlock()
	first, c := completedEntry(1), claimEntry()
	if put(tight, first) != nil || put(tight, c) != nil {
		t.Fatal("the claim and a small record do not fit")
	}
	if err := tight.Replace(c, completedEntry(300).Blob, 1); err != nil {
		t.Fatal(err)
	}
	if err := tight.Check(); err != nil {
		t.Fatal(err)
	}
	if tight.Lookup(first.Key) != nil || tight.Lookup(c.Key) != c {
		t.Fatal("a replace that needs bytes did not evict the oldest completed entry")
	}

	full := newTable(t, 10, Size(claimEntry().Blob)*2)
	full.Lock()
	defer full.Unlock()
	other, mine := claimEntry(), claimEntry()
	put(full, other)
	put(full, mine)
	if err := full.Replace(mine, completedEntry(1000).Blob, 1); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a replace that cannot fit = %v, want ErrUnavailable", err)
	}
	if err := full.Check(); err != nil {
		t.Fatal(err)
	}
	if full.Lookup(mine.Key) != nil || full.Lookup(other.Key) != other {
		t.Fatal("a replace that cannot fit must take its own entry out and leave the other claims")
	}
}
