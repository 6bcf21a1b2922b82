package memory

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const (
	sweepInterval = time.Minute
	// entryOverhead approximates what one record costs beyond its encoded
	// blob, so max_bytes stays honest for many small records: the entry
	// struct (88 bytes, a 96-byte allocation) and its map slot (a 32-byte
	// key and a pointer, in a map 7/16 to 7/8 full: 46 to 92 bytes).
	entryOverhead = 160
)

// now is replaceable in tests.
var now = time.Now

var errFull = fmt.Errorf("%w: memory store is full of in-flight claims", store.ErrUnavailable)

// table is the map shared by every config that uses the same limits.
//
// It may hold a hundred thousand records for as long as their TTL, and the
// GC marks everything they point to on every cycle. So a record is kept in
// the shared codec's encoding, one pointer-free blob the GC never scans,
// and an entry holds just three pointers: the blob and its links in the
// eviction list.
type table struct {
	mu      sync.Mutex
	entries map[store.Key]*entry
	// oldest and newest are the ends of the list of completed entries, in
	// order of completion: the eviction order. Claims are not in it.
	oldest, newest *entry
	bytes          int64
	maxEntries     int
	maxBytes       int64
	stop           chan struct{}
}

type entry struct {
	key store.Key
	// blob is the encoded record. It is never written once built (a new
	// blob replaces it), so records decoded from it may alias it, and it
	// may be decoded outside the lock. Its head tells the state and the
	// owner, so that ownership is checked without decoding, as the Redis
	// store's scripts do.
	blob store.Encoded
	// expires is the end of the lease or TTL, in Unix nanoseconds: a
	// time.Time would hold a *Location for the GC to follow.
	expires    int64
	size       int64
	prev, next *entry // in the eviction list, once completed
}

func newTable(maxEntries int, maxBytes int64) *table {
	t := &table{
		entries:    make(map[store.Key]*entry),
		maxEntries: maxEntries,
		maxBytes:   maxBytes,
		stop:       make(chan struct{}),
	}
	go t.sweep()
	return t
}

// Destruct stops the sweeper when the last config using the table is gone.
func (t *table) Destruct() error {
	close(t.stop)
	return nil
}

func (t *table) sweep() {
	tick := time.NewTicker(sweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.mu.Lock()
			n := now().UnixNano()
			for _, e := range t.entries {
				if n >= e.expires {
					t.remove(e)
				}
			}
			t.mu.Unlock()
		}
	}
}

// live returns the unexpired entry for k, dropping an expired one.
func (t *table) live(k store.Key, n int64) *entry {
	e := t.entries[k]
	if e != nil && n >= e.expires {
		t.remove(e)
		return nil
	}
	return e
}

func (t *table) remove(e *entry) {
	delete(t.entries, e.key)
	if e.blob.State() == store.Completed {
		t.unlink(e)
	}
	t.bytes -= e.size
}

// insert adds e, sized for its blob, to the table.
func (t *table) insert(e *entry) {
	e.size = int64(len(e.blob) + entryOverhead)
	t.entries[e.key] = e
	t.bytes += e.size
	if e.blob.State() == store.Completed {
		e.prev, e.next = t.newest, nil
		if t.newest != nil {
			t.newest.next = e
		} else {
			t.oldest = e
		}
		t.newest = e
	}
}

func (t *table) unlink(e *entry) {
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

// makeRoom evicts the oldest completed records until need more bytes and
// one more entry fit. Claims in flight are never evicted: dropping one
// would let a duplicate run while its owner still runs.
func (t *table) makeRoom(need int64) error {
	for len(t.entries) >= t.maxEntries || t.bytes+need > t.maxBytes {
		if t.oldest == nil {
			return errFull
		}
		t.remove(t.oldest)
	}
	return nil
}
