package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// name is the registry name of the table a store with these limits uses:
// every store with the same limits shares one table.
func name(maxEntries int, maxBytes int64) string {
	return fmt.Sprintf("memory:%d/%d", maxEntries, maxBytes)
}

// Lookup returns key's live record, copied, and its expiry.
func (m *Memory) Lookup(_ context.Context, key store.Key) (*store.Record, time.Time, error) {
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live(key, now())
	if e == nil {
		return nil, time.Time{}, nil
	}
	rec := e.rec // Header and Body are never mutated in place
	return &rec, e.expires, nil
}

// Delete removes key's record, whoever owns it.
func (m *Memory) Delete(_ context.Context, key store.Key) (bool, error) {
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.live(key, now())
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
	t := m.tab
	t.mu.Lock()
	n := now()
	cutoff := n.Add(-olderThan)
	var out []store.Entry
	for k, e := range t.entries {
		if e.rec.State != store.InProgress || !n.Before(e.expires) || e.rec.CreatedAt.After(cutoff) {
			continue
		}
		out = append(out, store.Entry{Key: k, Summary: store.Summarize(&e.rec), ExpiresAt: e.expires})
	}
	t.mu.Unlock()
	return store.SortEntries(out, limit), nil
}

var _ store.Inspector = (*Memory)(nil)
