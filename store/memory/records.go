package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

// Acquire claims k for c unless it has a live record, which it returns.
func (m *Memory) Acquire(_ context.Context, k store.Key, c *store.Claim) (store.Acquired, error) {
	found, tookOver, err := m.claim(k, c)
	if found == nil || err != nil {
		return store.Acquired{TookOver: tookOver}, err
	}
	rec, err := store.DecodeRecord(found)
	return store.Acquired{Record: rec, TookOver: tookOver}, err
}

// claim records c's claim unless k has a live record, whose blob it returns
// to be decoded outside the lock.
func (m *Memory) claim(k store.Key, c *store.Claim) (found store.Encoded, tookOver bool, err error) {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	n := now()
	nano := n.UnixNano()
	// An expired claim still here is a dead owner's: this takes it over,
	// or with KeepUnknown makes it its request's unknown outcome.
	if e := t.Lookup(k); e != nil {
		if nano < e.Expires {
			return e.Blob, false, nil
		}
		tookOver = e.Blob.State() == store.InProgress
		if tookOver && c.KeepUnknown {
			blob, expires, err := unknownOutcome(e.Blob, c, n)
			if err != nil {
				return nil, false, err
			}
			err = t.Replace(e, blob, expires.UnixNano())
			m.countEvictions()
			if err != nil {
				return nil, false, err
			}
			return blob, true, nil
		}
		t.Remove(e)
	}
	blob := store.AppendClaim(nil, c) // only now: a replay needs none
	err = t.MakeRoom(table.Size(blob))
	m.countEvictions()
	if err != nil {
		return nil, false, err
	}
	t.Insert(k, blob, n.Add(c.Lease).UnixNano())
	return nil, tookOver, nil
}

// unknownOutcome is the record that the dead claim becomes for c, with
// KeepUnknown: the dead claim's binding, under c's token, kept for c.TTL.
func unknownOutcome(dead store.Encoded, c *store.Claim, n time.Time) (store.Encoded, time.Time, error) {
	rec, err := store.DecodeRecord(dead)
	if err != nil {
		return nil, time.Time{}, err
	}
	expires := n.Add(c.TTL)
	heir := &store.Claim{Token: c.Token, Endpoint: rec.Endpoint, Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt}
	return store.AppendCompleted(nil, heir, &store.Response{OutcomeUnknown: true}, expires), expires, nil
}

// Complete replaces the claim c with resp, kept for ttl.
func (m *Memory) Complete(_ context.Context, k store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	expires := now().Add(ttl)
	blob := store.AppendCompleted(nil, c, resp, expires) // outside the lock: c has the binding
	t := m.tab
	t.Lock()
	defer t.Unlock()
	e, err := m.owned(k, c.Token, now().UnixNano())
	if err != nil {
		return err
	}
	if int64(len(blob)) > m.maxRecord {
		// Kept, it would evict too many of the others; the claim stays,
		// so that its retries are not run again while its lease lasts.
		return errTooLarge
	}
	err = t.Replace(e, blob, expires.UnixNano())
	m.countEvictions()
	return err
}

var errTooLarge = fmt.Errorf("%w: the response is larger than a quarter of the memory store's max_bytes", store.ErrUnavailable)

// countEvictions counts the live records the table has just evicted. The
// table is locked.
func (m *Memory) countEvictions() {
	if n := m.tab.TakeEvicted(); n > 0 {
		m.evicted.Add(float64(n))
	}
}

// Release deletes the claim held by tok, its lease passed or not: until a
// takeover, its owner knows best what became of its request.
func (m *Memory) Release(_ context.Context, k store.Key, tok store.Token) error {
	t := m.tab
	t.Lock()
	defer t.Unlock()
	e := t.Lookup(k)
	if e == nil || !e.Blob.ClaimedBy(tok) {
		return store.ErrNotOwner
	}
	t.Remove(e)
	return nil
}

// Renew sets the lease of the claim held by tok to lease from now.
func (m *Memory) Renew(_ context.Context, k store.Key, tok store.Token, lease time.Duration) error {
	m.tab.Lock()
	defer m.tab.Unlock()
	n := now()
	e, err := m.owned(k, tok, n.UnixNano())
	if err != nil {
		return err
	}
	e.Expires = n.Add(lease).UnixNano()
	return nil
}

// owned returns k's entry if tok holds its claim within its lease at n. A
// claim whose lease has passed stays, for a takeover to find. The table is
// locked.
func (m *Memory) owned(k store.Key, tok store.Token, n int64) (*table.Entry, error) {
	e := m.tab.Lookup(k)
	if e == nil || n >= e.Expires || !e.Blob.ClaimedBy(tok) {
		return nil, store.ErrNotOwner
	}
	return e, nil
}

var _ store.Store = (*Memory)(nil)
