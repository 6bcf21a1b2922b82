package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultName is the table of the store blocks that name none.
const defaultName = "memory"

// exactSize writes n bytes in the largest binary unit that divides it.
func exactSize(n int64) string {
	for _, u := range []struct {
		shift uint
		unit  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.unit)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// Lookup returns key's live record, decoded, and its expiry.
func (m *Memory) Lookup(_ context.Context, key store.Key) (*store.Record, time.Time, error) {
	t := m.tab
	t.Lock()
	e := t.Live(key, now().UnixNano())
	if e == nil {
		t.Unlock()
		return nil, time.Time{}, nil
	}
	blob, expires := e.Blob, e.Expires
	t.Unlock()
	rec, err := store.DecodeRecord(blob)
	if err != nil {
		return nil, time.Time{}, err
	}
	return rec, time.Unix(0, expires), nil
}

// Delete removes key's record, whoever owns it.
func (m *Memory) Delete(_ context.Context, key store.Key) (bool, error) {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	e := t.Live(key, now().UnixNano())
	if e != nil {
		t.Remove(e)
	}
	return e != nil, nil
}

// InFlight scans every record of the table under its lock.
func (m *Memory) InFlight(_ context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if limit <= 0 {
		return nil, nil
	}
	n := now()
	out, err := m.claims(n, n.Add(-olderThan))
	if err != nil {
		return nil, err
	}
	return store.SortEntries(out, limit), nil
}

// claims lists the live claims made by cutoff, decoding only claims.
func (m *Memory) claims(n, cutoff time.Time) ([]store.Entry, error) {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	nano := n.UnixNano()
	var out []store.Entry
	for e := range t.All() {
		if e.Blob.State() != store.InProgress || nano >= e.Expires {
			continue
		}
		rec, err := store.DecodeRecord(e.Blob)
		if err != nil {
			return nil, err
		}
		if !rec.CreatedAt.After(cutoff) {
			out = append(out, store.Entry{Key: e.Key, Summary: store.Summarize(rec), ExpiresAt: time.Unix(0, e.Expires)})
		}
	}
	return out, nil
}

var _ store.Inspector = (*Memory)(nil)
