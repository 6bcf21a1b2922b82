package file

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// newClaims returns claims without a journal, to test them alone.
func newClaims() *claims { return &claims{byKey: make(map[store.Key]*held)} }

// A claim whose completion is being committed holds its key even past its
// lease: no takeover, no release, no second completion. A failed commit
// gives it back to its owner; a committed one drops it.
func TestClaimsPinnedDuringCompletion(t *testing.T) {
	cs := newClaims()
	k, c := storetest.NewKey(), claim(time.Second)
	t0 := time.Now()
	if r, err := cs.take(k, c, t0, cs.generation(k)); r.holder != nil || r.stale || err != nil {
		t.Fatalf("take = %+v, %v", r, err)
	}
	e, err := cs.pin(k, c.Token, t0)
	if err != nil {
		t.Fatal(err)
	}
	late := t0.Add(time.Minute)
	if r, _ := cs.take(k, claim(time.Second), late, cs.generation(k)); !r.holder.ClaimedBy(c.Token) {
		t.Fatal("a claim being completed was taken over after its lease")
	}
	if err := cs.release(k, c.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("release during the completion = %v, want ErrNotOwner", err)
	}
	if _, err := cs.pin(k, c.Token, t0); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("second completion = %v, want ErrNotOwner", err)
	}
	if _, _, ok, _ := cs.lookup(k, late); !ok {
		t.Fatal("lookup does not see a claim being completed")
	}

	cs.settle(k, e, false)
	if err := cs.renew(k, c.Token, time.Second, t0); err != nil {
		t.Fatalf("renew after a failed commit: %v", err)
	}
	if e, err = cs.pin(k, c.Token, t0); err != nil {
		t.Fatalf("completing again after a failed commit: %v", err)
	}
	cs.settle(k, e, true)
	if _, _, ok, _ := cs.lookup(k, t0); ok {
		t.Fatal("the claim outlived its committed completion")
	}
}

// A claim is refused, as stale, when a completion of the key's shard was
// committed after the caller read the file, which may then have missed it;
// the completion of a key of another shard does not matter.
func TestClaimsStaleBehindACompletion(t *testing.T) {
	cs := newClaims()
	k, owner := storetest.NewKey(), claim(time.Minute)
	other := k
	other[0]++
	t0 := time.Now()
	cs.take(k, owner, t0, cs.generation(k))
	gen, otherGen := cs.generation(k), cs.generation(other)
	e, err := cs.pin(k, owner.Token, t0)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := cs.take(k, claim(time.Minute), t0, gen); !r.holder.ClaimedBy(owner.Token) || r.stale {
		t.Fatal("a claim being completed was not returned as the key's holder")
	}
	cs.settle(k, e, true)
	if r, _ := cs.take(k, claim(time.Minute), t0, gen); r.holder != nil || !r.stale {
		t.Fatalf("take behind a committed completion = %v, stale %v; want stale", r.holder, r.stale)
	}
	if _, _, ok, _ := cs.lookup(k, t0); ok {
		t.Fatal("a stale take claimed the key")
	}
	if r, _ := cs.take(other, claim(time.Minute), t0, otherGen); r.holder != nil || r.stale {
		t.Fatalf("take of another shard = %v, stale %v; want a claim", r.holder, r.stale)
	}
	if r, _ := cs.take(k, claim(time.Minute), t0, cs.generation(k)); r.holder != nil || r.stale {
		t.Fatalf("take after reading the file again = %v, stale %v; want a claim", r.holder, r.stale)
	}
}

// An operator's purge during a completion is not undone by its end, and
// the key is free for a new claim that the old completion cannot drop.
func TestClaimsRemovedDuringCompletion(t *testing.T) {
	cs := newClaims()
	k, c := storetest.NewKey(), claim(time.Minute)
	t0 := time.Now()
	cs.take(k, c, t0, cs.generation(k))
	e, err := cs.pin(k, c.Token, t0)
	if err != nil {
		t.Fatal(err)
	}
	if found, err := cs.remove(k, t0); !found || err != nil {
		t.Fatalf("remove = %v, %v", found, err)
	}
	next := claim(time.Minute)
	if r, _ := cs.take(k, next, t0, cs.generation(k)); r.holder != nil {
		t.Fatal("the purged key is still held")
	}
	cs.settle(k, e, true)
	if blob, _, ok, _ := cs.lookup(k, t0); !ok || !blob.ClaimedBy(next.Token) {
		t.Fatal("the purged owner's completion dropped the new claim")
	}
}

// A claim past its lease is a dead owner's, taken over as such, until its
// TTL has passed as well, sweeps or not; then it is gone: swept, and no
// takeover if claimed first.
func TestClaimsTakeoverAndSweep(t *testing.T) {
	cs := newClaims()
	t0 := time.Now()
	hour := func() *store.Claim {
		c := claim(time.Second)
		c.TTL = time.Hour
		return c
	}
	dead := func(k store.Key) { cs.take(k, hour(), t0, cs.generation(k)) }
	k, swept := storetest.NewKey(), storetest.NewKey()
	dead(k)
	dead(swept)
	cs.sweep(t0.Add(time.Minute))
	if len(cs.byKey) != 2 {
		t.Fatalf("%d claims left after a sweep past their lease, within their TTL; want both", len(cs.byKey))
	}
	if r, _ := cs.take(k, hour(), t0.Add(time.Minute), cs.generation(k)); !r.tookOver {
		t.Fatal("replacing a claim past its lease, within its TTL, was not a takeover")
	}
	cs.sweep(t0.Add(2 * time.Hour))
	if len(cs.byKey) != 0 {
		t.Fatalf("%d claims left after sweeping past every lease and TTL", len(cs.byKey))
	}
	gone := storetest.NewKey()
	dead(gone)
	if r, _ := cs.take(gone, hour(), t0.Add(2*time.Hour), cs.generation(gone)); r.tookOver {
		t.Fatal("claiming a key whose dead claim's TTL had passed was a takeover")
	}
	cs.close()
	if _, err := cs.take(k, claim(time.Second), t0, cs.generation(k)); !errors.Is(err, errClosed) {
		t.Fatalf("take once closed = %v", err)
	}
	if err := cs.release(k, storetest.NewToken()); !errors.Is(err, errClosed) {
		t.Fatalf("release once closed = %v", err)
	}
}
