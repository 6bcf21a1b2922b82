package storetest

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// RunTakeover checks that a store reports takeovers in Acquired.TookOver: set
// when a claim replaced an in-progress claim whose lease had passed, and
// only then.
func RunTakeover(t *testing.T, open Opener) {
	t.Run("TookOver", func(t *testing.T) {
		t.Run("FreshClaim", func(t *testing.T) { testTakeoverFresh(t, open(t)) })
		t.Run("AfterLeaseExpiry", func(t *testing.T) { testTakeoverAfterLease(t, open(t)) })
		t.Run("AfterRelease", func(t *testing.T) { testTakeoverAfterRelease(t, open(t)) })
		t.Run("AfterTTL", func(t *testing.T) { testTakeoverAfterTTL(t, open(t)) })
	})
}

// acquireReporting acquires k for c, and returns the record and whether
// the claim took one over.
func acquireReporting(t *testing.T, s store.Store, k store.Key, c *store.Claim) (*store.Record, bool) {
	t.Helper()
	got, err := s.Acquire(ctx(t), k, c)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return got.Record, got.TookOver
}

func testTakeoverFresh(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	if rec, took := acquireReporting(t, s, k, c); rec != nil || took {
		t.Fatalf("first Acquire = %+v, TookOver %v; want a claim that took nothing over", rec, took)
	}
	// A conflict is no claim, let alone a takeover.
	if rec, took := acquireReporting(t, s, k, newClaim(time.Minute)); rec == nil || took {
		t.Fatalf("Acquire of a held key = %+v, TookOver %v; want the claim, no takeover", rec, took)
	}
}

func testTakeoverAfterLease(t *testing.T, s store.Store) {
	k, stale := NewKey(), newClaim(shortLease)
	mustAcquire(t, s, k, stale)
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec, took := acquireReporting(t, s, k, newClaim(time.Minute)); rec != nil || !took {
		t.Fatalf("Acquire after the lease passed = %+v, TookOver %v; want a takeover", rec, took)
	}
}

func testTakeoverAfterRelease(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Release(ctx(t), k, c.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if rec, took := acquireReporting(t, s, k, newClaim(time.Minute)); rec != nil || took {
		t.Fatalf("Acquire after Release = %+v, TookOver %v; want a claim that took nothing over", rec, took)
	}
}

func testTakeoverAfterTTL(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, completed(200, []byte("x")), shortLease); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec, took := acquireReporting(t, s, k, newClaim(time.Minute)); rec != nil || took {
		t.Fatalf("Acquire after the TTL passed = %+v, TookOver %v; want a claim that took nothing over", rec, took)
	}
}
