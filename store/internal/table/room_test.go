package table

import (
	"bytes"
	"errors"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// keys lists the keys of the table's entries.
func keys(tab *Table) map[store.Key]bool {
	ks := make(map[store.Key]bool)
	for e := range tab.All() {
		ks[e.Key] = true
	}
	return ks
}

// MakeRoom evicts nothing when evicting every completed entry would not
// make the room: a record larger than the table, or one that the claims
// leave no room for, fails with the other records all kept.
func TestMakeRoomEvictsNothingInVain(t *testing.T) {
	tab := newTable(t, 100, 4*Size(completedBlob(100))+Size(claimBlob()))
	tab.Lock()
	defer tab.Unlock()
	for range 3 {
		mustPut(t, tab, completedBlob(100))
	}
	mustPut(t, tab, claimBlob())
	before := keys(tab)
	for _, need := range []int64{
		tab.MaxBytes() + 1,                     // more than the table
		tab.MaxBytes() - Size(claimBlob()) + 1, // more than the claim leaves
	} {
		if err := tab.MakeRoom(need); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("MakeRoom(%d) in a table of %d = %v, want ErrUnavailable", need, tab.MaxBytes(), err)
		}
		if err := tab.Check(); err != nil {
			t.Fatal(err)
		}
		if tab.Len() != len(before) {
			t.Fatalf("MakeRoom(%d) failed and left %d of the %d entries", need, tab.Len(), len(before))
		}
	}
	// what the claim leaves is room enough: everything completed goes
	if err := tab.MakeRoom(tab.MaxBytes() - Size(claimBlob())); err != nil || tab.Len() != 1 {
		t.Fatalf("MakeRoom for all but the claim = %v, %d entries left; want only the claim", err, tab.Len())
	}
}

// A completion that cannot fit leaves the claim where it was, its owner's
// still, and evicts nothing.
func TestReplaceThatCannotFitKeepsTheClaim(t *testing.T) {
	tab := newTable(t, 100, 4*Size(completedBlob(100))+Size(claimBlob()))
	tab.Lock()
	defer tab.Unlock()
	for range 3 {
		mustPut(t, tab, completedBlob(100))
	}
	claim := mustPut(t, tab, claimBlob())
	blob, expires := claim.Blob, claim.Expires
	before := keys(tab)
	if err := tab.Replace(claim, completedBlob(int(tab.MaxBytes())), 1); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a replace larger than the table = %v, want ErrUnavailable", err)
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	if got := keys(tab); len(got) != len(before) {
		t.Fatalf("a replace larger than the table left %d of the %d entries", len(got), len(before))
	}
	if tab.Lookup(claim.Key) != claim || !bytes.Equal(claim.Blob, blob) || claim.Expires != expires {
		t.Fatal("a replace larger than the table changed the claim")
	}
}
