// Package table is the bounded map of encoded records that the memory
// store and the shared stores' local tier (package tier) are built on.
package table

import (
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const (
	sweepInterval = time.Minute
	// overhead approximates what a record costs beyond its blob (its slot,
	// index words, allocation rounding), so max_bytes stays honest.
	overhead = 128
	// chunkLen slots are allocated at a time, so that entries never move.
	chunkLen = 1 << 10
	none     = -1
	// MaxEntries is the most entries a table holds: slots are numbered in
	// an int32, packed with their hash in one index word.
	MaxEntries = 1 << 30
)

var (
	errFull     = fmt.Errorf("%w: memory store is full of in-flight claims", store.ErrUnavailable)
	errTooLarge = fmt.Errorf("%w: the record is larger than the memory store holds", store.ErrUnavailable)
)

// Table is a map of records bounded in entries and bytes. Every method but
// Destruct is called with its mutex held. So that the GC follows one
// pointer per record, each is a pointer-free blob in slots of a few large
// arrays, linked by slot number and found through an index (index.go).
// Kept over a Go map and container/list: under bench/flood.sh those cost
// 1.06 and 1.24 times its Caddy CPU per request (docs/performance.md).
type Table struct {
	sync.Mutex
	index  []uint64
	chunks [][]Entry
	slots  int32 // slots handed out, in use or free
	free   int32 // the first free slot; each free slot's next is the one after
	n      int   // entries
	// oldest and newest end the eviction list: the completed entries in
	// order of completion. completed and evictable count its entries and
	// bytes: what evicting can free.
	oldest, newest int32
	bytes          int64
	completed      int
	evictable      int64
	evicted        uint64 // see TakeEvicted
	maxEntries     int
	maxBytes       int64
	stop           chan struct{}
}

// Entry is one record in a Table, in a slot that never moves: a pointer to
// it is good while the table is locked and the entry in it.
type Entry struct {
	Key store.Key
	// Blob is the encoded record, never written once built, so records
	// decoded from it may alias it, even outside the lock. A free slot has
	// none.
	Blob store.Encoded
	// Expires is the end of the lease or TTL, in Unix nanoseconds: a
	// time.Time would hold a *Location for the GC to follow.
	Expires int64
	size    int64
	// prev and next link the eviction list, next also the free slots.
	prev, next int32
	slot       int32
}

// Size is what an entry holding blob counts for against the table's bytes.
func Size(blob store.Encoded) int64 { return int64(len(blob) + overhead) }

// New returns an empty table of at most maxEntries (and MaxEntries)
// entries and maxBytes bytes, with a sweeper of expired entries.
func New(maxEntries int, maxBytes int64) *Table {
	t := &Table{maxEntries: min(maxEntries, MaxEntries), maxBytes: maxBytes, stop: make(chan struct{})}
	t.Clear()
	go t.sweep()
	return t
}

// SetLimits changes the table's bounds, evicting the oldest completed
// records until the entries fit the new ones. Claims are never evicted: a
// table full of them stays over its bounds until they end.
func (t *Table) SetLimits(maxEntries int, maxBytes int64) {
	t.maxEntries, t.maxBytes = min(maxEntries, MaxEntries), maxBytes
	t.evictFor(0, 0)
}

// Destruct stops the sweeper.
func (t *Table) Destruct() error {
	close(t.stop)
	return nil
}

func (t *Table) sweep() {
	tick := time.NewTicker(sweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.Lock()
			n := time.Now().UnixNano()
			for e := range t.All() {
				if n >= e.Expires {
					t.Remove(e)
				}
			}
			t.Unlock()
		}
	}
}

func (t *Table) at(s int32) *Entry { return &t.chunks[s/chunkLen][s%chunkLen] }

// Lookup returns the entry for k, expired or not; nil if there is none.
func (t *Table) Lookup(k store.Key) *Entry {
	pos, found := t.find(&k)
	if !found {
		return nil
	}
	return t.at(slotOf(t.index[pos]))
}

// Live returns the entry for k unexpired at n (Unix nanoseconds), dropping
// an expired one.
func (t *Table) Live(k store.Key, n int64) *Entry {
	e := t.Lookup(k)
	if e != nil && n >= e.Expires {
		t.Remove(e)
		return nil
	}
	return e
}

// Remove drops e from the table and frees its slot.
func (t *Table) Remove(e *Entry) {
	t.uncount(e)
	pos, _ := t.find(&e.Key)
	t.unindex(pos)
	s := e.slot
	*e = Entry{slot: s, next: t.free} // lets go of the blob
	t.free = s
	t.n--
}

// Insert adds k's record and returns its entry; a completed one becomes
// the newest to evict. Room must have been made, and k have no entry.
func (t *Table) Insert(k store.Key, blob store.Encoded, expires int64) *Entry {
	if len(blob) == 0 {
		panic("table: inserting an empty blob")
	}
	t.grow()
	h := hash32(&k)
	pos, found := t.probe(&k, h)
	if found {
		panic("table: inserting a key the table holds")
	}
	e := t.takeSlot()
	e.Key, e.Blob, e.Expires = k, blob, expires
	t.index[pos] = pack(h, e.slot)
	t.n++
	t.count(e)
	return e
}

// takeSlot returns a free slot, or a new one.
func (t *Table) takeSlot() *Entry {
	if t.free != none {
		e := t.at(t.free)
		t.free = e.next
		return e
	}
	if int(t.slots) == len(t.chunks)*chunkLen {
		t.chunks = append(t.chunks, make([]Entry, chunkLen))
	}
	e := t.at(t.slots)
	e.slot = t.slots
	t.slots++
	return e
}

// Replace gives e, a claim, a new blob and expiry in place, as Remove,
// MakeRoom and Insert would. Room is made with e's old blob uncounted, lest
// a blob that fits only in its place fail for ever; if there is none,
// nothing is evicted and e stays its owner's claim, whose retries do not
// run again while its lease lasts.
func (t *Table) Replace(e *Entry, blob store.Encoded, expires int64) error {
	t.uncount(e)
	if err := t.makeRoom(Size(blob), 0); err != nil {
		t.count(e)
		return err
	}
	e.Blob, e.Expires = blob, expires
	t.count(e)
	return nil
}

// count adds e to the bytes and, if completed, to the eviction list.
func (t *Table) count(e *Entry) {
	e.size = Size(e.Blob)
	t.bytes += e.size
	e.prev, e.next = none, none
	if e.Blob.State() == store.Completed {
		t.completed++
		t.evictable += e.size
		e.prev = t.newest
		if t.newest != none {
			t.at(t.newest).next = e.slot
		} else {
			t.oldest = e.slot
		}
		t.newest = e.slot
	}
}

// uncount takes e out of the table's bytes and the eviction list.
func (t *Table) uncount(e *Entry) {
	if e.Blob.State() == store.Completed {
		t.unlink(e)
		t.completed--
		t.evictable -= e.size
	}
	t.bytes -= e.size
}

func (t *Table) unlink(e *Entry) {
	if e.prev != none {
		t.at(e.prev).next = e.next
	} else {
		t.oldest = e.next
	}
	if e.next != none {
		t.at(e.next).prev = e.prev
	} else {
		t.newest = e.prev
	}
	e.prev, e.next = none, none
}

// MakeRoom evicts the oldest completed records until need more bytes and
// one more entry fit. Claims are never evicted: a duplicate would run too.
func (t *Table) MakeRoom(need int64) error { return t.makeRoom(need, 1) }

// makeRoom is MakeRoom for need bytes in more entries entries. It evicts
// only if evicting makes the room: to evict every completed record and
// fail anyway would lose them all for nothing.
func (t *Table) makeRoom(need int64, more int) error {
	switch {
	case need > t.maxBytes:
		return errTooLarge
	case t.n-t.completed+more > t.maxEntries || t.bytes-t.evictable+need > t.maxBytes:
		return errFull
	}
	t.evictFor(need, more)
	return nil
}

// evictFor evicts the oldest completed records until need more bytes and
// more entries fit, or none is left to evict.
func (t *Table) evictFor(need int64, more int) {
	var now int64
	for (t.n+more > t.maxEntries || t.bytes+need > t.maxBytes) && t.oldest != none {
		e := t.at(t.oldest)
		if now == 0 {
			now = time.Now().UnixNano()
		}
		if now < e.Expires {
			t.evicted++
		}
		t.Remove(e)
	}
}

// TakeEvicted returns how many completed entries were evicted before they
// expired since it was last called: records whose retries will run again.
func (t *Table) TakeEvicted() uint64 {
	n := t.evicted
	t.evicted = 0
	return n
}

// Clear drops every entry, and the memory of the slots and index.
func (t *Table) Clear() {
	t.index = make([]uint64, minIndex)
	t.chunks, t.slots, t.free, t.n = nil, 0, none, 0
	t.oldest, t.newest, t.bytes = none, none, 0
	t.completed, t.evictable = 0, 0
}

// All yields every entry, expired or not, in no order; it may be removed.
func (t *Table) All() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for s := range t.slots {
			if e := t.at(s); e.Blob != nil && !yield(e) {
				return
			}
		}
	}
}

// Len is the number of entries.
func (t *Table) Len() int { return t.n }

// Bytes is what the entries count for, overhead included.
func (t *Table) Bytes() int64 { return t.bytes }

// MaxBytes is the bound on Bytes.
func (t *Table) MaxBytes() int64 { return t.maxBytes }
