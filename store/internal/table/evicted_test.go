package table

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// TakeEvicted counts the completed entries evicted before they expired,
// once: not the expired ones, which nobody would have been answered from.
func TestTakeEvictedCountsLiveRecords(t *testing.T) {
	tab := newTable(t, 2, 1<<20)
	tab.Lock()
	defer tab.Unlock()
	tab.Insert(storetest.NewKey(), completedBlob(1), time.Now().Add(-time.Second).UnixNano())
	mustPut(t, tab, completedBlob(1))
	mustPut(t, tab, completedBlob(1)) // evicts the expired one
	if n := tab.TakeEvicted(); n != 0 {
		t.Fatalf("evicting an expired record counted %d", n)
	}
	mustPut(t, tab, completedBlob(1))
	mustPut(t, tab, completedBlob(1))
	if n := tab.TakeEvicted(); n != 2 {
		t.Fatalf("evicting two live records counted %d", n)
	}
	if n := tab.TakeEvicted(); n != 0 {
		t.Fatalf("a second take counted %d again", n)
	}
}
