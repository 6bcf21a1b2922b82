package table

import (
	"errors"
	"fmt"
	"iter"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// What the tests of the stores built on a table look at once they have
// driven it through the store: the table's own bookkeeping is beyond their
// reach in this package.

// Evictable yields the completed entries, oldest first: the order in
// which MakeRoom evicts them.
func (t *Table) Evictable() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for e := t.oldest; e != nil; e = e.next {
			if !yield(e) {
				return
			}
		}
	}
}

// Check reports the first way in which the counts or the eviction list
// disagree with the entries: an entry under another key or counted for
// other than its blob's Size, a byte count other than their sum, a list
// whose links disagree both ways, or one that holds other than every
// completed entry.
func (t *Table) Check() error {
	var bytes int64
	completed := 0
	for k, e := range t.entries {
		if e.Key != k {
			return fmt.Errorf("entry under %v has key %v", k, e.Key)
		}
		if e.size != Size(e.Blob) {
			return fmt.Errorf("entry counts %d bytes for a %d-byte blob", e.size, len(e.Blob))
		}
		bytes += e.size
		if e.Blob.State() == store.Completed {
			completed++
		}
	}
	if bytes != t.bytes {
		return fmt.Errorf("table counts %d bytes, its entries %d", t.bytes, bytes)
	}
	listed := 0
	var prev *Entry
	for e := t.oldest; e != nil; prev, e = e, e.next {
		if e.prev != prev {
			return errors.New("the eviction list's links disagree")
		}
		if listed == len(t.entries) || t.entries[e.Key] != e || e.Blob.State() != store.Completed {
			return fmt.Errorf("the eviction list holds %v, not a completed entry of the table", e.Key)
		}
		listed++
	}
	if prev != t.newest {
		return errors.New("the eviction list does not end at its newest entry")
	}
	if listed != completed {
		return fmt.Errorf("the eviction list holds %d entries of %d completed", listed, completed)
	}
	return nil
}
