package file

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A claim whose completion is being committed holds its key even past its
// lease: no takeover, no release, no second completion. A failed commit
// gives it back to its owner; a committed one drops it.
func TestClaimsPinnedDuringCompletion(t *testing.T) {
	cs := newClaims()
	k, c := storetest.NewKey(), claim(time.Second)
	t0 := time.Now()
	if holder, mine, _, err := cs.take(k, c, t0, false); holder != nil || mine == nil || err != nil {
		t.Fatalf("take = %v, %v, %v", holder, mine, err)
	}
	e, err := cs.pin(k, c.Token, t0)
	if err != nil {
		t.Fatal(err)
	}
	late := t0.Add(time.Minute)
	if holder, _, _, _ := cs.take(k, claim(time.Second), late, false); !holder.ClaimedBy(c.Token) {
		t.Fatal("a claim being completed was taken over after its lease")
	}
	if err := cs.release(k, c.Token, t0); !errors.Is(err, store.ErrNotOwner) {
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

// An operator's purge during a completion is not undone by its end, and
// the key is free for a new claim that the old completion cannot drop.
func TestClaimsRemovedDuringCompletion(t *testing.T) {
	cs := newClaims()
	k, c := storetest.NewKey(), claim(time.Minute)
	t0 := time.Now()
	cs.take(k, c, t0, false)
	e, err := cs.pin(k, c.Token, t0)
	if err != nil {
		t.Fatal(err)
	}
	if found, err := cs.remove(k, t0); !found || err != nil {
		t.Fatalf("remove = %v, %v", found, err)
	}
	next := claim(time.Minute)
	if holder, _, _, _ := cs.take(k, next, t0, false); holder != nil {
		t.Fatal("the purged key is still held")
	}
	cs.settle(k, e, true)
	if blob, _, ok, _ := cs.lookup(k, t0); !ok || !blob.ClaimedBy(next.Token) {
		t.Fatal("the purged owner's completion dropped the new claim")
	}
}

func TestClaimsTakeoverAndSweep(t *testing.T) {
	cs := newClaims()
	k := storetest.NewKey()
	t0 := time.Now()
	cs.take(k, claim(time.Second), t0, false)
	_, _, took, _ := cs.take(k, claim(time.Second), t0.Add(2*time.Second), false)
	if !took {
		t.Fatal("replacing a claim past its lease was not a takeover")
	}
	if _, _, took, _ := cs.take(storetest.NewKey(), claim(time.Second), t0, true); !took {
		t.Fatal("replacing a dead claim in the file was not a takeover")
	}
	cs.sweep(t0.Add(time.Minute))
	if len(cs.byKey) != 0 {
		t.Fatalf("%d claims left after sweeping past every lease", len(cs.byKey))
	}
	cs.close()
	if _, _, _, err := cs.take(k, claim(time.Second), t0, false); !errors.Is(err, errClosed) {
		t.Fatalf("take once closed = %v", err)
	}
	if err := cs.release(k, storetest.NewToken(), t0); !errors.Is(err, errClosed) {
		t.Fatalf("release once closed = %v", err)
	}
}
