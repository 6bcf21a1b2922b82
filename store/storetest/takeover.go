package storetest

import (
	"errors"
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
		t.Run("KeepUnknown", func(t *testing.T) { testKeepUnknown(t, open(t)) })
		t.Run("KeepUnknownLiveOrGone", func(t *testing.T) { testKeepUnknownNoDeadClaim(t, open(t)) })
		t.Run("ReleaseAfterLease", func(t *testing.T) { testReleaseAfterLease(t, open(t)) })
		t.Run("LateOwnerKeepsDeadClaim", func(t *testing.T) { testLateOwnerKeepsDeadClaim(t, open(t)) })
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

// testKeepUnknown checks that with KeepUnknown a dead owner's claim becomes
// its request's unknown outcome, bound as the dead claim was, whatever the
// binding of the claim that found it, and that it is then a live record
// like any other.
func testKeepUnknown(t *testing.T, s store.Store) {
	k, dead := NewKey(), newClaim(shortLease)
	dead.TTL = time.Minute
	mustAcquire(t, s, k, dead)
	time.Sleep(shortLease + 200*time.Millisecond)

	other := newClaim(time.Minute)
	other.Endpoint, other.TTL, other.KeepUnknown = "POST example.com/other", time.Minute, true
	rec, took := acquireReporting(t, s, k, other)
	if rec == nil || !took {
		t.Fatalf("Acquire with KeepUnknown after the lease passed = %+v, TookOver %v; want the unknown outcome, taken over", rec, took)
	}
	checkUnknownOf(t, "Acquire with KeepUnknown", rec, dead)

	// Now a completed record: found as it is, by a claim with or without
	// KeepUnknown, and no takeover.
	for _, keep := range []bool{false, true} {
		again := newClaim(time.Minute)
		again.TTL, again.KeepUnknown = time.Minute, keep
		rec, took := acquireReporting(t, s, k, again)
		if rec == nil || took {
			t.Fatalf("Acquire (KeepUnknown %v) after the unknown outcome = %+v, TookOver %v; want the record, no takeover", keep, rec, took)
		}
		checkUnknownOf(t, "the record found later", rec, dead)
	}
	// The token that made it cannot end it: it holds no claim.
	if err := s.Release(ctx(t), k, other.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Release by the token that found the dead claim = %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx(t), k, dead, completed(201, []byte("late")), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by the dead owner = %v, want ErrNotOwner", err)
	}
}

// testReleaseAfterLease checks that a claim whose lease has passed, and
// that nothing has taken over, is still its owner's to release: an owner
// that knows its request did not run, or asked for a retry, frees the key,
// rather than leave a claim to be taken for a dead owner's (with
// KeepUnknown, an unknown outcome: 502 to every retry).
func testReleaseAfterLease(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(shortLease)
	c.TTL = time.Minute
	mustAcquire(t, s, k, c)
	time.Sleep(shortLease + 200*time.Millisecond)
	if err := s.Release(ctx(t), k, c.Token); err != nil {
		t.Fatalf("Release after the lease passed = %v, want the claim released", err)
	}
	keep := newClaim(time.Minute)
	keep.TTL, keep.KeepUnknown = time.Minute, true
	if rec, took := acquireReporting(t, s, k, keep); rec != nil || took {
		t.Fatalf("Acquire with KeepUnknown after the release = %+v, TookOver %v; want a claim that took nothing over", rec, took)
	}
}

// testLateOwnerKeepsDeadClaim checks what the owner's renewal or
// completion does once its lease has passed, before any takeover: a store
// may take it (the claim is the owner's again, or completed), or refuse
// it, and then leave the dead claim as it was, for a retry with
// KeepUnknown to find; never drop it.
func testLateOwnerKeepsDeadClaim(t *testing.T, s store.Store) {
	late := map[string]func(store.Key, *store.Claim) error{
		"Renew": func(k store.Key, c *store.Claim) error { return s.Renew(ctx(t), k, c.Token, time.Minute) },
		"Complete": func(k store.Key, c *store.Claim) error {
			return s.Complete(ctx(t), k, c, completed(201, []byte("late")), time.Minute)
		},
	}
	for op, call := range late {
		k, dead := NewKey(), newClaim(shortLease)
		dead.TTL = time.Minute
		mustAcquire(t, s, k, dead)
		time.Sleep(shortLease + 200*time.Millisecond)
		err := call(k, dead)
		keep := newClaim(time.Minute)
		keep.TTL, keep.KeepUnknown = time.Minute, true
		rec, took := acquireReporting(t, s, k, keep)
		switch {
		case err == nil && (rec == nil || took):
			t.Fatalf("%s after the lease passed succeeded, yet a retry found %+v, TookOver %v; want the owner's claim or record", op, rec, took)
		case errors.Is(err, store.ErrNotOwner) && (rec == nil || !took):
			t.Fatalf("%s after the lease passed failed, and a retry with KeepUnknown found %+v, TookOver %v; want the dead claim's unknown outcome", op, rec, took)
		case errors.Is(err, store.ErrNotOwner):
			checkUnknownOf(t, "Acquire with KeepUnknown", rec, dead)
		case err != nil:
			t.Fatalf("%s after the lease passed = %v, want success or ErrNotOwner", op, err)
		}
	}
}

// checkUnknownOf checks that rec is the unknown outcome of dead's request.
func checkUnknownOf(t *testing.T, what string, rec *store.Record, dead *store.Claim) {
	t.Helper()
	switch {
	case rec.State != store.Completed || !rec.OutcomeUnknown:
		t.Fatalf("%s: state %v, outcome unknown %v; want a completed unknown outcome", what, rec.State, rec.OutcomeUnknown)
	case rec.Endpoint != dead.Endpoint || rec.Fingerprint != dead.Fingerprint:
		t.Fatalf("%s: bound to %q %x, want the dead claim's %q %x", what, rec.Endpoint, rec.Fingerprint[:4], dead.Endpoint, dead.Fingerprint[:4])
	case !rec.CreatedAt.Equal(dead.CreatedAt.Truncate(time.Microsecond)) && !rec.CreatedAt.Equal(dead.CreatedAt):
		t.Fatalf("%s: created at %v, want the dead claim's %v", what, rec.CreatedAt, dead.CreatedAt)
	case rec.ExpiresAt.IsZero() || time.Until(rec.ExpiresAt) < 30*time.Second:
		t.Fatalf("%s: expires at %v, want about a minute from now (the TTL)", what, rec.ExpiresAt)
	}
}

// testKeepUnknownNoDeadClaim checks that KeepUnknown changes nothing where
// no dead claim is: a new key, a live claim, a completed record.
func testKeepUnknownNoDeadClaim(t *testing.T, s store.Store) {
	keep := func() *store.Claim {
		c := newClaim(time.Minute)
		c.TTL, c.KeepUnknown = time.Minute, true
		return c
	}
	k, first := NewKey(), keep()
	if rec, took := acquireReporting(t, s, k, first); rec != nil || took {
		t.Fatalf("first Acquire with KeepUnknown = %+v, TookOver %v; want a plain claim", rec, took)
	}
	rec, took := acquireReporting(t, s, k, keep())
	if rec == nil || took || rec.State != store.InProgress || rec.Token != first.Token {
		t.Fatalf("Acquire of a live claim with KeepUnknown = %+v, TookOver %v; want the live claim", rec, took)
	}
	if err := s.Complete(ctx(t), k, first, completed(201, []byte("done")), time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, took = acquireReporting(t, s, k, keep())
	if rec == nil || took || rec.State != store.Completed || rec.OutcomeUnknown || rec.Status != 201 {
		t.Fatalf("Acquire of a completed record with KeepUnknown = %+v, TookOver %v; want the record", rec, took)
	}
}
