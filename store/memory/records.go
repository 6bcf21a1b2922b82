package memory

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Acquire claims k for c unless it has a live record, which it returns
// decoded once the table's lock is released.
func (m *Memory) Acquire(_ context.Context, k store.Key, c *store.Claim) (*store.Record, error) {
	found, err := m.tab.claim(k, c)
	if found == nil || err != nil {
		return nil, err
	}
	return store.DecodeRecord(found)
}

// claim records c's claim unless k has a live record, whose blob it returns
// for the caller to decode once the lock is released.
func (t *table) claim(k store.Key, c *store.Claim) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	nano := n.UnixNano()
	c.TookOver = false
	// An expired claim still here (the sweeper has not dropped it yet) is a
	// dead owner's: claiming the key now takes it over.
	old := t.entries[k]
	dead := old != nil && nano >= old.expires && old.blob.State() == store.InProgress
	if e := t.live(k, nano); e != nil {
		return e.blob, nil
	}
	blob := store.AppendClaim(nil, c, n)
	if err := t.makeRoom(int64(len(blob) + entryOverhead)); err != nil {
		return nil, err
	}
	t.insert(&entry{key: k, blob: blob, expires: n.Add(c.Lease).UnixNano()})
	c.TookOver, c.CreatedAt = dead, n
	return nil, nil
}

// Complete replaces the claim c with rec, kept for ttl.
func (m *Memory) Complete(_ context.Context, k store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	// The record is encoded before taking the lock: it needs nothing from
	// the table, since the claim carries the binding Acquire stored.
	blob := store.AppendCompleted(nil, c, rec)
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	e, err := t.owned(k, c.Token, n.UnixNano())
	if err != nil {
		return err
	}
	// Room is made with the claim itself out of the way, so a response too
	// big for the whole table evicts others rather than failing forever.
	t.remove(e)
	if err := t.makeRoom(int64(len(blob) + entryOverhead)); err != nil {
		return err
	}
	e.blob, e.expires = blob, n.Add(ttl).UnixNano()
	t.insert(e)
	return nil
}

// Release deletes the claim held by tok.
func (m *Memory) Release(_ context.Context, k store.Key, tok store.Token) error {
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.owned(k, tok, now().UnixNano())
	if err != nil {
		return err
	}
	t.remove(e)
	return nil
}

// Renew sets the lease of the claim held by tok to lease from now.
func (m *Memory) Renew(_ context.Context, k store.Key, tok store.Token, lease time.Duration) error {
	t := m.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	e, err := t.owned(k, tok, n.UnixNano())
	if err != nil {
		return err
	}
	e.expires = n.Add(lease).UnixNano()
	return nil
}

// owned returns k's in-progress entry if tok holds it.
func (t *table) owned(k store.Key, tok store.Token, n int64) (*entry, error) {
	e := t.live(k, n)
	if e == nil || !e.blob.ClaimedBy(tok) {
		return nil, store.ErrNotOwner
	}
	return e, nil
}

var _ store.Store = (*Memory)(nil)
