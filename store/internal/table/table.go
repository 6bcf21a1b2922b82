// Package table is the bounded map of encoded records that the memory
// store and the shared stores' local tier (package tier) are built on: its
// entries, their eviction list and the bytes they are counted for.
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
	// overhead approximates what one record costs beyond its encoded
	// blob, so max_bytes stays honest for many small records: the Entry
	// struct (88 bytes, a 96-byte allocation) and its map slot (a 32-byte
	// key and a pointer, in a map 7/16 to 7/8 full: 46 to 92 bytes).
	overhead = 160
)

var errFull = fmt.Errorf("%w: memory store is full of in-flight claims", store.ErrUnavailable)

// Table is a map of records bounded in entries and bytes. Its mutex
// guards it: every method but Destruct is called with it held.
//
// It may hold a hundred thousand records for as long as their TTL, and the
// GC marks everything they point to on every cycle. So a record is kept in
// the shared codec's encoding, one pointer-free blob the GC never scans,
// and an entry holds just three pointers: the blob and its links in the
// eviction list.
type Table struct {
	sync.Mutex
	entries map[store.Key]*Entry
	// oldest and newest are the ends of the list of completed entries, in
	// order of completion: the eviction order. Claims are not in it.
	oldest, newest *Entry
	bytes          int64
	maxEntries     int
	maxBytes       int64
	stop           chan struct{}
}

// Entry is one record in a Table.
type Entry struct {
	Key store.Key
	// Blob is the encoded record. It is never written once built (a new
	// blob replaces it, and only while the entry is out of the table,
	// between Remove and Insert), so records decoded from it may alias
	// it, and it may be decoded outside the lock. Its head tells the
	// state and the owner, so that ownership is checked without decoding,
	// as the Redis store's scripts do.
	Blob store.Encoded
	// Expires is the end of the lease or TTL, in Unix nanoseconds: a
	// time.Time would hold a *Location for the GC to follow.
	Expires    int64
	size       int64
	prev, next *Entry // in the eviction list, once completed
}

// Size is what an entry holding blob counts for against the table's bytes.
func Size(blob store.Encoded) int64 { return int64(len(blob) + overhead) }

// New returns an empty table of at most maxEntries entries and maxBytes
// bytes, whose sweeper drops expired entries until Destruct.
func New(maxEntries int, maxBytes int64) *Table {
	t := &Table{
		entries:    make(map[store.Key]*Entry),
		maxEntries: maxEntries,
		maxBytes:   maxBytes,
		stop:       make(chan struct{}),
	}
	go t.sweep()
	return t
}

// Destruct stops the sweeper when the last config using the table is gone.
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
			for _, e := range t.entries {
				if n >= e.Expires {
					t.Remove(e)
				}
			}
			t.Unlock()
		}
	}
}

// Lookup returns the entry for k, expired or not; nil if there is none.
func (t *Table) Lookup(k store.Key) *Entry { return t.entries[k] }

// Live returns the entry for k unexpired at n (Unix nanoseconds), dropping
// an expired one.
func (t *Table) Live(k store.Key, n int64) *Entry {
	e := t.entries[k]
	if e != nil && n >= e.Expires {
		t.Remove(e)
		return nil
	}
	return e
}

// Remove drops e from the table.
func (t *Table) Remove(e *Entry) {
	delete(t.entries, e.Key)
	t.uncount(e)
}

// Insert adds e, sized for its blob, to the table; a completed record
// becomes the newest in the eviction list. Room must have been made.
func (t *Table) Insert(e *Entry) {
	t.entries[e.Key] = e
	t.count(e)
}

// Replace gives e, an entry of the table, a new blob and expiry: what
// Remove, MakeRoom and Insert would do, without the two map writes. Room
// is made with e's old blob already uncounted, so that a blob too big for
// the whole table evicts others rather than failing forever; if room
// cannot be made, e leaves the table, as it would have been removed.
func (t *Table) Replace(e *Entry, blob store.Encoded, expires int64) error {
	t.uncount(e)
	if err := t.makeRoom(Size(blob), 0); err != nil {
		delete(t.entries, e.Key)
		return err
	}
	e.Blob, e.Expires = blob, expires
	t.count(e)
	return nil
}

// count adds e, sized for its blob, to the table's bytes and, if
// completed, to the eviction list as its newest.
func (t *Table) count(e *Entry) {
	e.size = Size(e.Blob)
	t.bytes += e.size
	if e.Blob.State() == store.Completed {
		e.prev, e.next = t.newest, nil
		if t.newest != nil {
			t.newest.next = e
		} else {
			t.oldest = e
		}
		t.newest = e
	}
}

// uncount takes e out of the table's bytes and the eviction list.
func (t *Table) uncount(e *Entry) {
	if e.Blob.State() == store.Completed {
		t.unlink(e)
	}
	t.bytes -= e.size
}

func (t *Table) unlink(e *Entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		t.oldest = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		t.newest = e.prev
	}
	e.prev, e.next = nil, nil
}

// MakeRoom evicts the oldest completed records until need more bytes and
// one more entry fit. Claims in flight are never evicted: dropping one
// would let a duplicate run while its owner still runs.
func (t *Table) MakeRoom(need int64) error { return t.makeRoom(need, 1) }

// makeRoom is MakeRoom for need bytes in more entries entries.
func (t *Table) makeRoom(need int64, more int) error {
	for len(t.entries)+more > t.maxEntries || t.bytes+need > t.maxBytes {
		if t.oldest == nil {
			return errFull
		}
		t.Remove(t.oldest)
	}
	return nil
}

// Clear drops every entry.
func (t *Table) Clear() {
	clear(t.entries)
	t.oldest, t.newest, t.bytes = nil, nil, 0
}

// All yields every entry, expired or not, in no order. The entry yielded
// may be removed.
func (t *Table) All() iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for _, e := range t.entries {
			if !yield(e) {
				return
			}
		}
	}
}

// Len is the number of entries.
func (t *Table) Len() int { return len(t.entries) }

// Bytes is what the entries count for, overhead included.
func (t *Table) Bytes() int64 { return t.bytes }

// MaxBytes is the bound on Bytes.
func (t *Table) MaxBytes() int64 { return t.maxBytes }
