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

// The point of the table's layout: per record the GC follows the blob,
// which it does not scan, and nothing else. A pointer link, a time.Time, a
// string or a header map here would bring back a pointer chase per record
// per cycle, and the index must hold none.
func TestEntryIsNearlyPointerFree(t *testing.T) {
	if n := pointers(reflect.TypeFor[Entry]()); n != 1 {
		t.Fatalf("entry holds %d pointers, want 1 (the blob)", n)
	}
	if pointers(reflect.TypeFor[Entry]().Field(1).Type.Elem()) != 0 {
		t.Fatal("the blob's elements hold pointers")
	}
	if pointers(reflect.TypeFor[Table]().Field(1).Type.Elem()) != 0 {
		t.Fatal("the index holds pointers")
	}
	// what overhead says it counts: the slot and two to four index words
	if size := reflect.TypeFor[Entry]().Size(); size+4*8 > overhead {
		t.Fatalf("an entry takes %d bytes and up to 32 of index: more than the %d of overhead counted", size, overhead)
	}
}

func newTable(t *testing.T, maxEntries int, maxBytes int64) *Table {
	tab := New(maxEntries, maxBytes)
	t.Cleanup(func() { tab.Destruct() })
	return tab
}

func claimBlob() store.Encoded {
	return store.AppendClaim(nil, &store.Claim{Token: storetest.NewToken(), CreatedAt: time.Now()})
}

func completedBlob(size int) store.Encoded {
	return store.AppendCompleted(nil, &store.Claim{Token: storetest.NewToken()}, &store.Response{Status: 201, Body: make([]byte, size)}, time.Time{})
}

// put makes room for blob under a new key and inserts it, as the stores
// do.
func put(t *Table, blob store.Encoded) (*Entry, error) {
	if err := t.MakeRoom(Size(blob)); err != nil {
		return nil, err
	}
	return t.Insert(storetest.NewKey(), blob, time.Now().Add(time.Hour).UnixNano()), nil
}

func mustPut(t *testing.T, tab *Table, blob store.Encoded) *Entry {
	t.Helper()
	e, err := put(tab, blob)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// MakeRoom evicts completed entries oldest first and never a claim; the
// counts and the list stay right through inserts, evictions and removals.
func TestMakeRoomEvictsOldestCompletedOnly(t *testing.T) {
	tab := newTable(t, 5, 1<<20)
	tab.Lock()
	defer tab.Unlock()
	claim := mustPut(t, tab, claimBlob())
	var completed []*Entry
	for i := range 10 {
		completed = append(completed, mustPut(t, tab, completedBlob(i*10)))
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
	want := []*Entry{completed[6], completed[8], completed[9]} // the slots that hold them
	if !reflect.DeepEqual(listed, want) || tab.Lookup(claim.Key) != claim || tab.Len() != 4 {
		t.Fatalf("listed %d entries, %d in the table; want the 3 newest completed and the claim", len(listed), tab.Len())
	}

	full := newTable(t, 2, 1<<20)
	full.Lock()
	defer full.Unlock()
	mustPut(t, full, claimBlob())
	mustPut(t, full, claimBlob())
	if _, err := put(full, completedBlob(1)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("MakeRoom in a table full of claims = %v, want ErrUnavailable", err)
	}
}

// Check finds each kind of broken bookkeeping.
func TestCheckFindsBrokenBookkeeping(t *testing.T) {
	for name, breakIt := range map[string]func(*Table){
		"bytes":       func(tab *Table) { tab.bytes++ },
		"size":        func(tab *Table) { tab.at(tab.oldest).size++ },
		"key":         func(tab *Table) { tab.at(tab.oldest).Key[0]++ },
		"hash":        func(tab *Table) { tab.index[position(tab, tab.at(tab.newest))] ^= 1 << 40 },
		"unindexed":   func(tab *Table) { tab.unindex(position(tab, tab.at(tab.oldest))) },
		"count":       func(tab *Table) { tab.n-- },
		"free list":   func(tab *Table) { tab.free = none },
		"back link":   func(tab *Table) { tab.at(tab.newest).prev = none },
		"newest":      func(tab *Table) { tab.newest = tab.oldest },
		"cycle":       func(tab *Table) { tab.at(tab.newest).next = tab.oldest },
		"unlisted":    func(tab *Table) { tab.unlink(tab.at(tab.newest)) },
		"listed free": func(tab *Table) { tab.at(tab.newest).next = tab.free },
	} {
		tab := newTable(t, 10, 1<<20)
		for _, blob := range []store.Encoded{completedBlob(1), claimBlob(), completedBlob(2), completedBlob(3), claimBlob()} {
			mustPut(t, tab, blob)
		}
		tab.Remove(tab.Lookup(keyOfLast(tab))) // a free slot
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
// completed entries, and one that cannot fit leaves the claim as it was.
func TestReplaceCompletesInPlace(t *testing.T) {
	tab := newTable(t, 3, 1<<20)
	tab.Lock()
	defer tab.Unlock()
	old, claim := mustPut(t, tab, completedBlob(1)), mustPut(t, tab, claimBlob())
	mustPut(t, tab, completedBlob(2))
	done := completedBlob(3)
	if err := tab.Replace(claim, done, 42); err != nil {
		t.Fatal(err)
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	if tab.Len() != 3 || tab.at(tab.newest) != claim || tab.Lookup(old.Key) != old || claim.Expires != 42 || !bytes.Equal(claim.Blob, done) {
		t.Fatalf("a replace at the entry limit: %d entries, want 3 with the claim newest and nothing evicted", tab.Len())
	}

	// room for the claim and one small record, or the big one alone
	tight := newTable(t, 10, Size(completedBlob(300))+Size(completedBlob(1))-1)
	tight.Lock()
	defer tight.Unlock()
	first, c := mustPut(t, tight, completedBlob(1)), mustPut(t, tight, claimBlob())
	firstKey := first.Key
	if err := tight.Replace(c, completedBlob(300), 1); err != nil {
		t.Fatal(err)
	}
	if err := tight.Check(); err != nil {
		t.Fatal(err)
	}
	if tight.Lookup(firstKey) != nil || tight.Lookup(c.Key) != c {
		t.Fatal("a replace that needs bytes did not evict the oldest completed entry")
	}

	full := newTable(t, 10, Size(claimBlob())*2)
	full.Lock()
	defer full.Unlock()
	other, mine := mustPut(t, full, claimBlob()), mustPut(t, full, claimBlob())
	mineKey, blob := mine.Key, mine.Blob
	if err := full.Replace(mine, completedBlob(1000), 1); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a replace that cannot fit = %v, want ErrUnavailable", err)
	}
	if err := full.Check(); err != nil {
		t.Fatal(err)
	}
	if full.Lookup(mineKey) != mine || !bytes.Equal(mine.Blob, blob) || full.Lookup(other.Key) != other {
		t.Fatal("a replace that cannot fit must leave its own claim and the other claims")
	}
}

// position is where the index holds e.
func position(tab *Table, e *Entry) int {
	pos, _ := tab.find(&e.Key)
	return pos
}

// keyOfLast is the key in the last slot handed out.
func keyOfLast(tab *Table) store.Key { return tab.at(tab.slots - 1).Key }
