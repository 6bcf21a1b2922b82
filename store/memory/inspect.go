package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// registryName is the registry name of the table a store with these limits uses:
// every store with the same limits shares one table.
func registryName(maxEntries int, maxBytes int64) string {
	return fmt.Sprintf("memory:%d/%d", maxEntries, maxBytes)
}

// Lookup returns key's live record, decoded, and its expiry.
func (m *Memory) Lookup(_ context.Context, key store.Key) (*store.Record, time.Time, error) {
	t := m.tab
	t.mu.Lock()
	e := t.live(key, now().UnixNano())
	if e == nil {
		t.mu.Unlock()
		return nil, time.Time{}, nil
	}
	blob, expires := e.blob, e.expires
	t.mu.Unlock()
	rec, err := store.DecodeRecord(blob)
	if err != nil {
		return nil, time.Time{}, err
	}
	return rec, time.Unix(0, expires), nil
}

// Delete removes key's record, whoever owns it.
func (m *Memory) Delete(_ context.Context, key store.Key) (bool, error) {
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live(key, now().UnixNano())
	if e == nil {
		return false, nil
	}
	t.remove(e)
	return true, nil
}

// InFlight scans the table under its lock. In-flight claims are few (at
// most the requests running), but the scan visits every record, so it
// holds the lock for about a millisecond per 100,000 records.
func (m *Memory) InFlight(_ context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if limit <= 0 {
		return nil, nil
	}
	n := now()
	out, err := m.tab.claims(n, n.Add(-olderThan))
	if err != nil {
		return nil, err
	}
	return store.SortEntries(out, limit), nil
}

// claims lists the live claims made by cutoff. Only claims are decoded, to
// learn their age: the state byte tells the rest apart.
func (t *table) claims(n, cutoff time.Time) ([]store.Entry, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	nano := n.UnixNano()
	var out []store.Entry
	for k, e := range t.entries {
		if e.blob.State() != store.InProgress || nano >= e.expires {
			continue
		}
		rec, err := store.DecodeRecord(e.blob)
		if err != nil {
			return nil, err
		}
		if !rec.CreatedAt.After(cutoff) {
			out = append(out, store.Entry{Key: k, Summary: store.Summarize(rec), ExpiresAt: time.Unix(0, e.expires)})
		}
	}
	return out, nil
}

var _ store.Inspector = (*Memory)(nil)
