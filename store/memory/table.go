package memory

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// now is replaceable in tests.
var now = time.Now

var errFull = fmt.Errorf("%w: memory store is full of in-flight claims", store.ErrUnavailable)

// table is the map shared by every config that uses the same limits.
type table struct {
	mu         sync.Mutex
	entries    map[store.Key]*entry
	completed  *list.List // of *entry, oldest completion first: the eviction order
	bytes      int64
	maxEntries int
	maxBytes   int64
	stop       chan struct{}
}

type entry struct {
	key     store.Key
	rec     store.Record
	expires time.Time
	size    int64
	elem    *list.Element // in table.completed, once completed
}

func newTable(maxEntries int, maxBytes int64) *table {
	t := &table{
		entries:    make(map[store.Key]*entry),
		completed:  list.New(),
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
			n := now()
			for _, e := range t.entries {
				if !n.Before(e.expires) {
					t.remove(e)
				}
			}
			t.mu.Unlock()
		}
	}
}

// live returns the unexpired entry for k, dropping an expired one.
func (t *table) live(k store.Key, n time.Time) *entry {
	e := t.entries[k]
	if e != nil && !n.Before(e.expires) {
		t.remove(e)
		return nil
	}
	return e
}

func (t *table) remove(e *entry) {
	delete(t.entries, e.key)
	if e.elem != nil {
		t.completed.Remove(e.elem)
	}
	t.bytes -= e.size
}

// owned returns k's in-progress entry if tok holds it.
func (t *table) owned(k store.Key, tok store.Token, n time.Time) (*entry, error) {
	e := t.live(k, n)
	if e == nil || e.rec.State != store.InProgress || e.rec.Token != tok {
		return nil, store.ErrNotOwner
	}
	return e, nil
}

// makeRoom evicts the oldest completed records until need more bytes and
// one more entry fit. Claims in flight are never evicted: dropping one
// would let a duplicate run while its owner still runs.
func (t *table) makeRoom(need int64) error {
	for len(t.entries) >= t.maxEntries || t.bytes+need > t.maxBytes {
		front := t.completed.Front()
		if front == nil {
			return errFull
		}
		t.remove(front.Value.(*entry))
	}
	return nil
}

func (t *table) acquire(k store.Key, c *store.Claim) (*store.Record, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	c.TookOver = false
	// An expired claim still here (the sweeper has not dropped it yet) is a
	// dead owner's: claiming the key now takes it over.
	old := t.entries[k]
	dead := old != nil && !n.Before(old.expires) && old.rec.State == store.InProgress
	if e := t.live(k, n); e != nil {
		rec := e.rec // the caller gets a copy; Header and Body are never mutated
		return &rec, nil
	}
	size := int64(entryOverhead + len(c.Endpoint))
	if err := t.makeRoom(size); err != nil {
		return nil, err
	}
	e := &entry{
		key: k,
		rec: store.Record{
			State:       store.InProgress,
			Token:       c.Token,
			Endpoint:    c.Endpoint,
			Fingerprint: c.Fingerprint,
			CreatedAt:   n,
		},
		expires: n.Add(c.Lease),
		size:    size,
	}
	t.entries[k] = e
	t.bytes += size
	c.TookOver, c.CreatedAt = dead, n
	return nil, nil
}

func (t *table) complete(k store.Key, tok store.Token, rec *store.Record, ttl time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	e, err := t.owned(k, tok, n)
	if err != nil {
		return err
	}
	size := recordSize(e.rec.Endpoint, rec)
	// Room is made with the claim itself out of the way, so a response too
	// big for the whole table evicts others rather than failing forever.
	t.remove(e)
	if err := t.makeRoom(size); err != nil {
		return err
	}
	e.rec.State = store.Completed
	e.rec.Status = rec.Status
	e.rec.Header = rec.Header.Clone()
	e.rec.Body = append([]byte(nil), rec.Body...)
	e.rec.Truncated = rec.Truncated
	e.expires = n.Add(ttl)
	e.size = size
	e.elem = t.completed.PushBack(e)
	t.entries[k] = e
	t.bytes += size
	return nil
}

func recordSize(endpoint string, rec *store.Record) int64 {
	size := int64(entryOverhead + len(endpoint) + len(rec.Body))
	for name, values := range rec.Header {
		size += int64(len(name))
		for _, v := range values {
			size += int64(len(v) + 16)
		}
	}
	return size
}

func (t *table) release(k store.Key, tok store.Token) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.owned(k, tok, now())
	if err != nil {
		return err
	}
	t.remove(e)
	return nil
}

func (t *table) renew(k store.Key, tok store.Token, lease time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	e, err := t.owned(k, tok, n)
	if err != nil {
		return err
	}
	e.expires = n.Add(lease)
	return nil
}
