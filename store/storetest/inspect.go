package storetest

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// RunInspector runs the contract of store.Inspector against the stores that
// open returns, which must implement it. The stores need not be empty:
// every check looks only at the keys it made.
func RunInspector(t *testing.T, open Opener) {
	t.Run("LookupAbsent", func(t *testing.T) { testLookupAbsent(t, open(t)) })
	t.Run("LookupInProgress", func(t *testing.T) { testLookupInProgress(t, open(t)) })
	t.Run("LookupCompleted", func(t *testing.T) { testLookupCompleted(t, open(t)) })
	t.Run("LookupExpired", func(t *testing.T) { testLookupExpired(t, open(t)) })
	t.Run("LookupOutcomeUnknown", func(t *testing.T) { testLookupOutcomeUnknown(t, open(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, open(t)) })
	t.Run("DeleteInProgress", func(t *testing.T) { testDeleteInProgress(t, open(t)) })
	t.Run("InFlight", func(t *testing.T) { testInFlight(t, open(t)) })
	t.Run("InFlightLimit", func(t *testing.T) { testInFlightLimit(t, open(t)) })
}

func inspector(t *testing.T, s store.Store) store.Inspector {
	t.Helper()
	in, ok := s.(store.Inspector)
	if !ok {
		t.Fatalf("%T does not implement store.Inspector", s)
	}
	return in
}

func mustLookup(t *testing.T, in store.Inspector, k store.Key) (*store.Record, time.Time) {
	t.Helper()
	rec, exp, err := in.Lookup(ctx(t), k)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if rec == nil && !exp.IsZero() {
		t.Fatalf("Lookup of an absent key gave expiry %v", exp)
	}
	return rec, exp
}

// about fails unless got is within a few seconds of want: stores may take
// their times from another clock (PostgreSQL's) on the same machine.
func about(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -5*time.Second || d > 5*time.Second {
		t.Fatalf("%s = %v, want about %v", what, got, want)
	}
}

func testLookupAbsent(t *testing.T, s store.Store) {
	in := inspector(t, s)
	if rec, _ := mustLookup(t, in, NewKey()); rec != nil {
		t.Fatalf("Lookup of a key never used = %+v", rec)
	}
}

func testLookupInProgress(t *testing.T, s store.Store) {
	in := inspector(t, s)
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	rec, exp := mustLookup(t, in, k)
	if rec == nil || rec.State != store.InProgress || rec.Token != c.Token ||
		rec.Endpoint != c.Endpoint || rec.Fingerprint != c.Fingerprint {
		t.Fatalf("Lookup of a claim = %+v, want the claim", rec)
	}
	about(t, "CreatedAt", rec.CreatedAt, time.Now())
	about(t, "expiry of the claim", exp, time.Now().Add(time.Minute))
	// Lookup changes nothing: the owner still owns the claim.
	if err := s.Renew(ctx(t), k, c.Token, 2*time.Minute); err != nil {
		t.Fatalf("Renew after Lookup: %v", err)
	}
	if _, exp := mustLookup(t, in, k); exp.Sub(time.Now()) < 90*time.Second {
		t.Fatalf("expiry after renewing for 2m = %v, want the renewed lease", exp)
	}
}

func testLookupCompleted(t *testing.T, s store.Store) {
	in := inspector(t, s)
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	want := completed(201, []byte("{\"id\":1}\x00\xff"))
	if err := s.Complete(ctx(t), k, c, want, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, exp := mustLookup(t, in, k)
	switch {
	case rec == nil || rec.State != store.Completed:
		t.Fatalf("Lookup of a completed key = %+v", rec)
	case rec.Status != 201 || !bytes.Equal(rec.Body, want.Body) || rec.Truncated:
		t.Fatalf("Lookup: status %d body %q truncated %v", rec.Status, rec.Body, rec.Truncated)
	case rec.Endpoint != c.Endpoint || rec.Fingerprint != c.Fingerprint:
		t.Fatalf("Lookup: endpoint %q, binding lost", rec.Endpoint)
	case rec.Header.Get("Content-Type") != "application/json" || len(rec.Header["X-Multi"]) != 2:
		t.Fatalf("Lookup: headers %v", rec.Header)
	}
	about(t, "CreatedAt", rec.CreatedAt, time.Now())
	about(t, "expiry of the record", exp, time.Now().Add(time.Hour))
	if s := store.Summarize(rec); s.BodySize != len(want.Body) || s.Status != 201 || s.State != store.Completed {
		t.Fatalf("Summarize = %+v", s)
	}
	// The record still replays.
	if again := mustAcquire(t, s, k, newClaim(time.Minute)); again == nil || again.State != store.Completed {
		t.Fatalf("Acquire after Lookup = %+v, want the replay", again)
	}
}

// An operator finds the key of a request whose outcome is unknown, checks
// the backend, and purges the key so that the client may retry it.
func testLookupOutcomeUnknown(t *testing.T, s store.Store) {
	in := inspector(t, s)
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, &store.Response{OutcomeUnknown: true}, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec, exp := mustLookup(t, in, k)
	if rec == nil || rec.State != store.Completed || !rec.OutcomeUnknown || rec.Truncated || rec.Endpoint != c.Endpoint {
		t.Fatalf("Lookup of an unknown outcome = %+v", rec)
	}
	about(t, "expiry of the record", exp, time.Now().Add(time.Hour))
	if sum := store.Summarize(rec); !sum.OutcomeUnknown || sum.Truncated || sum.Status != 0 || sum.BodySize != 0 {
		t.Fatalf("Summarize = %+v", sum)
	}
	if found, err := in.Delete(ctx(t), k); err != nil || !found {
		t.Fatalf("Delete of an unknown outcome = %v, %v; want true", found, err)
	}
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec != nil {
		t.Fatalf("Acquire after the purge = %+v, want a new claim", rec)
	}
}

func testLookupExpired(t *testing.T, s store.Store) {
	in := inspector(t, s)
	claimK, doneK := NewKey(), NewKey()
	mustAcquire(t, s, claimK, newClaim(shortLease))
	c := newClaim(time.Minute)
	mustAcquire(t, s, doneK, c)
	if err := s.Complete(ctx(t), doneK, c, completed(200, []byte("x")), shortLease); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	for _, k := range []store.Key{claimK, doneK} {
		if rec, _ := mustLookup(t, in, k); rec != nil {
			t.Fatalf("Lookup after the lease or TTL passed = %+v, want none", rec)
		}
		if found, err := in.Delete(ctx(t), k); err != nil || found {
			t.Fatalf("Delete of an expired record = %v, %v; want false", found, err)
		}
	}
}

func testDelete(t *testing.T, s store.Store) {
	in := inspector(t, s)
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, completed(200, []byte("gone")), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	other, oc := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, other, oc)

	found, err := in.Delete(ctx(t), k)
	if err != nil || !found {
		t.Fatalf("Delete of a completed record = %v, %v; want true", found, err)
	}
	if rec, _ := mustLookup(t, in, k); rec != nil {
		t.Fatalf("Lookup after Delete = %+v", rec)
	}
	if found, err := in.Delete(ctx(t), k); err != nil || found {
		t.Fatalf("second Delete = %v, %v; want false", found, err)
	}
	if found, err := in.Delete(ctx(t), NewKey()); err != nil || found {
		t.Fatalf("Delete of a key never used = %v, %v; want false", found, err)
	}
	// The key is new again, and no other key was touched.
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec != nil {
		t.Fatalf("Acquire after Delete = %+v, want a new claim", rec)
	}
	if rec, _ := mustLookup(t, in, other); rec == nil || rec.Token != oc.Token {
		t.Fatalf("Delete of one key changed another: %+v", rec)
	}
}

func testDeleteInProgress(t *testing.T, s store.Store) {
	in := inspector(t, s)
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if found, err := in.Delete(ctx(t), k); err != nil || !found {
		t.Fatalf("Delete of a claim = %v, %v; want true", found, err)
	}
	next := newClaim(time.Minute)
	if rec := mustAcquire(t, s, k, next); rec != nil {
		t.Fatalf("Acquire after purging the claim = %+v, want a new claim", rec)
	}
	// The purged owner finishes: it must not touch the new claim.
	if err := s.Complete(ctx(t), k, c, completed(200, []byte("late")), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by the purged owner = %v, want ErrNotOwner", err)
	}
	if rec, _ := mustLookup(t, in, k); rec == nil || rec.Token != next.Token || rec.State != store.InProgress {
		t.Fatalf("new claim after the purged owner's Complete: %+v", rec)
	}
}

// find returns the entry of k in entries.
func find(entries []store.Entry, k store.Key) (store.Entry, bool) {
	i := slices.IndexFunc(entries, func(e store.Entry) bool { return e.Key == k })
	if i < 0 {
		return store.Entry{}, false
	}
	return entries[i], true
}

func mustInFlight(t *testing.T, in store.Inspector, olderThan time.Duration, limit int) []store.Entry {
	t.Helper()
	entries, err := in.InFlight(ctx(t), olderThan, limit)
	if err != nil {
		t.Fatalf("InFlight(%v, %d): %v", olderThan, limit, err)
	}
	if len(entries) > limit {
		t.Fatalf("InFlight(%v, %d) returned %d entries", olderThan, limit, len(entries))
	}
	if !slices.IsSortedFunc(entries, func(a, b store.Entry) int { return a.CreatedAt.Compare(b.CreatedAt) }) {
		t.Fatalf("InFlight(%v, %d) is not sorted oldest first", olderThan, limit)
	}
	for _, e := range entries {
		if e.State != store.InProgress || e.BodySize != 0 || e.Status != 0 {
			t.Fatalf("InFlight listed %+v, not a claim", e)
		}
		if !e.ExpiresAt.IsZero() && e.ExpiresAt.Before(time.Now().Add(-5*time.Second)) {
			t.Fatalf("InFlight listed an expired claim: %+v", e)
		}
	}
	return entries
}

func testInFlight(t *testing.T, s store.Store) {
	in := inspector(t, s)
	const age = 600 * time.Millisecond
	old, oc := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, old, oc)
	done, dc := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, done, dc)
	if err := s.Complete(ctx(t), done, dc, completed(200, []byte("done")), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	expired := NewKey()
	mustAcquire(t, s, expired, newClaim(shortLease))
	time.Sleep(age + 100*time.Millisecond)
	young, yc := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, young, yc)

	entries := mustInFlight(t, in, age, 1000)
	e, ok := find(entries, old)
	if !ok {
		t.Fatalf("InFlight(%v) did not list a claim held for longer", age)
	}
	if e.Endpoint != oc.Endpoint {
		t.Fatalf("listed claim has endpoint %q, want %q", e.Endpoint, oc.Endpoint)
	}
	about(t, "listed CreatedAt", e.CreatedAt, time.Now().Add(-age))
	if !e.ExpiresAt.IsZero() {
		about(t, "listed expiry", e.ExpiresAt, time.Now().Add(time.Minute-age))
	}
	for name, k := range map[string]store.Key{"a completed record": done, "an expired claim": expired, "a younger claim": young} {
		if _, ok := find(entries, k); ok {
			t.Errorf("InFlight(%v) listed %s", age, name)
		}
	}

	entries = mustInFlight(t, in, 0, 1000)
	for name, k := range map[string]store.Key{"the old claim": old, "the young claim": young} {
		if _, ok := find(entries, k); !ok {
			t.Errorf("InFlight(0) did not list %s", name)
		}
	}
	// Once completed, a claim is no longer in flight.
	if err := s.Complete(ctx(t), old, oc, completed(200, nil), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if _, ok := find(mustInFlight(t, in, 0, 1000), old); ok {
		t.Error("InFlight listed a claim after its completion")
	}
}

func testInFlightLimit(t *testing.T, s store.Store) {
	in := inspector(t, s)
	for range 3 {
		mustAcquire(t, s, NewKey(), newClaim(time.Minute))
	}
	if got := mustInFlight(t, in, 0, 2); len(got) != 2 {
		t.Fatalf("InFlight(0, 2) with 3 claims returned %d entries", len(got))
	}
	if got := mustInFlight(t, in, 0, 0); len(got) != 0 {
		t.Fatalf("InFlight(0, 0) returned %d entries", len(got))
	}
	// An age that nothing reaches lists nothing of ours.
	if got := mustInFlight(t, in, time.Hour, 1000); len(got) != 0 {
		for _, e := range got {
			if time.Since(e.CreatedAt) < 50*time.Minute {
				t.Fatalf("InFlight(1h) listed a claim created %v ago", time.Since(e.CreatedAt))
			}
		}
	}
}

// CheckInspectorUnavailable asserts that every Inspector method of s,
// whose backend the caller has made unreachable, fails with an error
// wrapping store.ErrUnavailable.
func CheckInspectorUnavailable(t *testing.T, s store.Store) {
	t.Helper()
	in := inspector(t, s)
	rec, _, err := in.Lookup(ctx(t), NewKey())
	if rec != nil || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Lookup on an unavailable store = %+v, %v; want ErrUnavailable", rec, err)
	}
	if _, err := in.Delete(ctx(t), NewKey()); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Delete on an unavailable store = %v, want ErrUnavailable", err)
	}
	if _, err := in.InFlight(ctx(t), 0, 10); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("InFlight on an unavailable store = %v, want ErrUnavailable", err)
	}
}
