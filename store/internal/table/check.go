package table

import (
	"errors"
	"fmt"
	"iter"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// For the tests of the stores built on a table.

// Evictable yields the completed entries, oldest first: the order in
// which MakeRoom evicts them.
func (t *Table) Evictable() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for s := t.oldest; s != none; s = t.at(s).next {
			if !yield(t.at(s)) {
				return
			}
		}
	}
}

// Check reports the first way in which the index, the slots, the counts,
// the free list or the eviction list disagree.
func (t *Table) Check() error {
	if err := t.checkIndex(); err != nil {
		return err
	}
	var bytes, evictable int64
	live, completed := 0, 0
	for e := range t.All() {
		if pos, found := t.find(&e.Key); !found || slotOf(t.index[pos]) != e.slot {
			return fmt.Errorf("entry %v is not indexed at its slot", e.Key)
		}
		if e.size != Size(e.Blob) {
			return fmt.Errorf("entry counts %d bytes for a %d-byte blob", e.size, len(e.Blob))
		}
		live++
		bytes += e.size
		if e.Blob.State() == store.Completed {
			completed++
			evictable += e.size
		}
	}
	if live != t.n {
		return fmt.Errorf("table counts %d entries, its slots hold %d", t.n, live)
	}
	if bytes != t.bytes {
		return fmt.Errorf("table counts %d bytes, its entries %d", t.bytes, bytes)
	}
	if completed != t.completed || evictable != t.evictable {
		return fmt.Errorf("table counts %d completed entries of %d bytes, its entries %d of %d", t.completed, t.evictable, completed, evictable)
	}
	free := 0
	for s := t.free; s != none; s = t.at(s).next {
		if free == int(t.slots) || t.at(s).Blob != nil {
			return fmt.Errorf("the free list holds slot %d, not a free slot", s)
		}
		free++
	}
	if free+live != int(t.slots) {
		return fmt.Errorf("%d slots, but %d entries and %d free", t.slots, live, free)
	}
	listed := 0
	prev := int32(none)
	for s := t.oldest; s != none; prev, s = s, t.at(s).next {
		e := t.at(s)
		if e.prev != prev {
			return errors.New("the eviction list's links disagree")
		}
		if listed == t.n || e.Blob == nil || e.Blob.State() != store.Completed {
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

// checkIndex reports an index position that names no entry, or that a
// lookup of its key would not reach.
func (t *Table) checkIndex() error {
	mask := len(t.index) - 1
	used := 0
	for pos, w := range t.index {
		if w == 0 {
			continue
		}
		used++
		s := slotOf(w)
		if s < 0 || s >= t.slots || t.at(s).Blob == nil {
			return fmt.Errorf("index position %d names slot %d, which holds no entry", pos, s)
		}
		e := t.at(s)
		if e.slot != s || hashOf(w) != hash32(&e.Key) {
			return fmt.Errorf("index position %d disagrees with the entry in slot %d", pos, s)
		}
		for p := home(t.index, hashOf(w)); p != pos; p = (p + 1) & mask {
			if t.index[p] == 0 {
				return fmt.Errorf("a lookup of the entry in slot %d stops short of its position", s)
			}
		}
	}
	if used != t.n || 2*used > len(t.index) {
		return fmt.Errorf("the index holds %d entries in %d positions, the table %d", used, len(t.index), t.n)
	}
	return nil
}
