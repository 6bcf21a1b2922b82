package table

import (
	"fmt"
	"iter"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// For the tests of the stores built on a table.

// Evictable yields the completed entries, oldest first: the order in
// which MakeRoom evicts them.
func (t *Table) Evictable() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for el := t.evictable.Front(); el != nil; el = el.Next() {
			if !yield(el.Value.(*Entry)) {
				return
			}
		}
	}
}

// Check reports the first way in which the map, the counts or the
// eviction list disagree.
func (t *Table) Check() error {
	var bytes, evictable int64
	completed := 0
	for k, e := range t.entries {
		if e.Key != k {
			return fmt.Errorf("entry %v is held under key %v", e.Key, k)
		}
		if e.size != Size(e.Blob) {
			return fmt.Errorf("entry counts %d bytes for a %d-byte blob", e.size, len(e.Blob))
		}
		bytes += e.size
		if done := e.Blob.State() == store.Completed; done != (e.elem != nil) {
			return fmt.Errorf("entry %v is completed %v, listed for eviction %v", e.Key, done, e.elem != nil)
		} else if done {
			completed++
			evictable += e.size
		}
	}
	if bytes != t.bytes {
		return fmt.Errorf("table counts %d bytes, its entries %d", t.bytes, bytes)
	}
	if evictable != t.evictableBytes {
		return fmt.Errorf("table counts %d evictable bytes, its entries %d", t.evictableBytes, evictable)
	}
	listed := 0
	for el := t.evictable.Front(); el != nil; el = el.Next() {
		e := el.Value.(*Entry)
		if listed == completed || e.elem != el || t.entries[e.Key] != e {
			return fmt.Errorf("the eviction list holds %v, not a completed entry of the table", e.Key)
		}
		listed++
	}
	if listed != completed {
		return fmt.Errorf("the eviction list holds %d entries of %d completed", listed, completed)
	}
	return nil
}
