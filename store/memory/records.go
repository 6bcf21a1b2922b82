package memory

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

// Acquire claims k for c unless it has a live record, which it returns
// decoded once the table's lock is released.
func (m *Memory) Acquire(_ context.Context, k store.Key, c *store.Claim) (*store.Record, error) {
	found, err := m.claim(k, c)
	if found == nil || err != nil {
		return nil, err
	}
	return store.DecodeRecord(found)
}

// claim records c's claim unless k has a live record, whose blob it returns
// for the caller to decode once the lock is released.
func (m *Memory) claim(k store.Key, c *store.Claim) ([]byte, error) {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	n := now()
	nano := n.UnixNano()
	c.TookOver = false
	// An expired claim still here (the sweeper has not dropped it yet) is a
	// dead owner's: claiming the key now takes it over.
	dead := false
	if e := t.Lookup(k); e != nil {
		if nano < e.Expires {
			return e.Blob, nil
		}
		dead = e.Blob.State() == store.InProgress
		t.Remove(e)
	}
	blob := store.AppendClaim(nil, c, n)
	if err := t.MakeRoom(table.Size(blob)); err != nil {
		return nil, err
	}
	t.Insert(k, blob, n.Add(c.Lease).UnixNano())
	c.TookOver, c.CreatedAt = dead, n
	return nil, nil
}

// Complete replaces the claim c with rec, kept for ttl.
func (m *Memory) Complete(_ context.Context, k store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	// The record is encoded before taking the lock: it needs nothing from
	// the table, since the claim carries the binding Acquire stored.
	blob := store.AppendCompleted(nil, c, rec)
	t := m.tab
	t.Lock()
	defer t.Unlock()
	n := now()
	e, err := m.owned(k, c.Token, n.UnixNano())
	if err != nil {
		return err
	}
	return t.Replace(e, blob, n.Add(ttl).UnixNano())
}

// Release deletes the claim held by tok.
func (m *Memory) Release(_ context.Context, k store.Key, tok store.Token) error {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	e, err := m.owned(k, tok, now().UnixNano())
	if err != nil {
		return err
	}
	t.Remove(e)
	return nil
}

// Renew sets the lease of the claim held by tok to lease from now.
func (m *Memory) Renew(_ context.Context, k store.Key, tok store.Token, lease time.Duration) error {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	n := now()
	e, err := m.owned(k, tok, n.UnixNano())
	if err != nil {
		return err
	}
	e.Expires = n.Add(lease).UnixNano()
	return nil
}

// owned returns k's in-progress entry if tok holds it. The table must be
// locked.
func (m *Memory) owned(k store.Key, tok store.Token, n int64) (*table.Entry, error) {
	e := m.tab.Live(k, n)
	if e == nil || !e.Blob.ClaimedBy(tok) {
		return nil, store.ErrNotOwner
	}
	return e, nil
}

var _ store.Store = (*Memory)(nil)
