package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func open(t testing.TB, m *Memory) *Memory {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Cleanup() })
	return m
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, &Memory{}) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return open(t, &Memory{}) })
}

func TestSharedAcrossReloads(t *testing.T) {
	a := open(t, &Memory{MaxEntries: 7})
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	if rec, _ := a.Acquire(context.Background(), k, c); rec != nil {
		t.Fatal("claim failed")
	}
	// A reload provisions a new module before the old one is cleaned up.
	b := open(t, &Memory{MaxEntries: 7})
	a.Cleanup()
	a.Cleanup() // idempotent
	if rec, _ := b.Acquire(context.Background(), k, &store.Claim{Lease: time.Minute}); rec == nil || rec.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v", rec)
	}
}

func TestBoundedEntriesEvictsOldestCompleted(t *testing.T) {
	m := open(t, &Memory{MaxEntries: 3, MaxBytes: 1 << 30})
	ctx := context.Background()
	keys := make([]store.Key, 4)
	for i := range keys {
		keys[i] = storetest.NewKey()
		c := &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
		if _, err := m.Acquire(ctx, keys[i], c); err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		if err := m.Complete(ctx, keys[i], c, &store.Record{Status: 200}, time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
	}
	if n := len(m.tab.entries); n != 3 {
		t.Fatalf("%d entries kept, want the bound of 3", n)
	}
	if _, ok := m.tab.entries[keys[0]]; ok {
		t.Fatal("the oldest completed record was not the one evicted")
	}
}

func TestFullOfClaimsFailsInsteadOfEvicting(t *testing.T) {
	m := open(t, &Memory{MaxEntries: 2, MaxBytes: 1 << 30})
	ctx := context.Background()
	for range 2 {
		if _, err := m.Acquire(ctx, storetest.NewKey(), &store.Claim{Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Acquire(ctx, storetest.NewKey(), &store.Claim{Lease: time.Minute})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire on a table full of claims = %v, want ErrUnavailable", err)
	}
}

func TestBoundedBytes(t *testing.T) {
	m := open(t, &Memory{MaxEntries: 1000, MaxBytes: 10_000})
	ctx := context.Background()
	for range 20 {
		k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
		if _, err := m.Acquire(ctx, k, c); err != nil {
			t.Fatal(err)
		}
		if err := m.Complete(ctx, k, c, &store.Record{Status: 200, Body: make([]byte, 2000)}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if m.tab.bytes > 10_000 {
			t.Fatalf("table holds %d bytes, over its bound of 10000", m.tab.bytes)
		}
	}
}

func TestSweepDropsExpired(t *testing.T) {
	m := open(t, &Memory{MaxEntries: 50})
	ctx := context.Background()
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	m.Acquire(ctx, k, c)
	m.Complete(ctx, k, c, &store.Record{Status: 200, Body: []byte("x")}, time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	m.tab.mu.Lock()
	e := m.tab.live(k, now().UnixNano())
	n, b := len(m.tab.entries), m.tab.bytes
	m.tab.mu.Unlock()
	if e != nil || n != 0 || b != 0 {
		t.Fatalf("expired record still counted: entry %v, %d entries, %d bytes", e, n, b)
	}
}
