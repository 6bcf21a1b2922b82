package redis

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// skew sets this instance's clock (the package's now) off Redis's by d,
// ahead if positive, until the test ends or skew is called again.
func skew(t *testing.T, d time.Duration) {
	now = func() time.Time { return time.Now().Add(d) }
	t.Cleanup(func() { now = time.Now })
}

// leaseLeft is how far the lease end in the head of k's claim is ahead of
// Redis's clock.
func leaseLeft(t *testing.T, srv *testredis.Server, s *Store, k store.Key) time.Duration {
	t.Helper()
	end := leaseEnd(t, srv, s, k)
	redisNow, err := srv.Client().Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return end.Sub(redisNow)
}

// Redis's clock decides whether a claim's lease has passed: an instance
// whose clock runs ahead, by however much, takes no running request's
// claim over, and costs one takeover script to learn it.
func TestClockAheadTakesNothingOver(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	k, owner := storetest.NewKey(), claim()
	if _, err := s.Acquire(ctx, k, owner); err != nil {
		t.Fatal(err)
	}
	if err := takeoverScript.Load(ctx, srv.Client()).Err(); err != nil {
		t.Fatal(err)
	}
	skew(t, time.Hour)
	var got store.Acquired
	var err error
	ran := commands(t, srv, func() { got, err = s.Acquire(ctx, k, claim()) })
	if err != nil || got.Record == nil || got.Record.Token != owner.Token || got.TookOver {
		t.Fatalf("Acquire by an instance an hour ahead = %+v, %v; want the running claim, no takeover", got, err)
	}
	if want := map[string]int64{"set": 1, "evalsha": 1, "get": 1, "time": 1}; !maps.Equal(ran, want) {
		t.Errorf("the instance ahead ran %v, want its SET NX GET and one takeover script, %v", ran, want)
	}
	skew(t, 0)
	if err := s.Renew(ctx, k, owner.Token, time.Minute); err != nil {
		t.Fatalf("the owner's Renew: %v", err)
	}
	if err := s.Complete(ctx, k, owner, testResponse("once"), time.Minute); err != nil {
		t.Fatalf("the owner's Complete: %v", err)
	}
}

// What remains of the clocks: a new key's claim is a plain SET NX GET, so
// its first lease end is the claimant's clock; renewals and takeovers stamp
// Redis's. A claimant behind Redis by d stamps a lease end d early, until
// its first renewal a third of a lease later: it keeps its claim if d is
// under two thirds of the lease. Redis's clock cannot be moved, so the
// claimant is put a further third of a lease behind instead: its claim is
// then, at once, as it would be when that renewal is due.
func TestClockBehindBound(t *testing.T) {
	const lease = time.Minute
	const margin = 5 * time.Second // for the calls' own time
	bound := 2 * lease / 3
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	claimBehind := func(d time.Duration) (store.Key, *store.Claim) {
		k, c := storetest.NewKey(), claim()
		c.Lease = lease
		skew(t, -d)
		if got, err := s.Acquire(ctx, k, c); err != nil || got.Record != nil {
			t.Fatalf("Acquire = %+v, %v; want a claim", got, err)
		}
		return k, c
	}
	// A reader far ahead: its own clock would take anything over.
	readerAhead := func() { skew(t, time.Hour) }

	t.Run("within", func(t *testing.T) {
		k, c := claimBehind(bound - margin + lease/3)
		readerAhead()
		if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record == nil || got.Record.Token != c.Token || got.TookOver {
			t.Fatalf("Acquire when the renewal is due = %+v, %v; want the claim held", got, err)
		}
		skew(t, -(bound - margin))
		if err := s.Renew(ctx, k, c.Token, lease); err != nil {
			t.Fatalf("the owner's first renewal: %v", err)
		}
		// Renewed, the lease end is Redis's clock: the skew no longer counts.
		if left := leaseLeft(t, srv, s, k); left < lease-margin || left > lease+margin {
			t.Fatalf("the renewed lease ends %v ahead of Redis's clock, want %v", left, lease)
		}
	})
	t.Run("beyond", func(t *testing.T) {
		k, c := claimBehind(bound + margin + lease/3)
		readerAhead()
		got, err := s.Acquire(ctx, k, claim())
		if err != nil || got.Record != nil || !got.TookOver {
			t.Fatalf("Acquire when the renewal is due = %+v, %v; want a takeover", got, err)
		}
		// A takeover's lease end is Redis's clock too.
		if left := leaseLeft(t, srv, s, k); left < lease-margin || left > lease+margin {
			t.Fatalf("the takeover's lease ends %v ahead of Redis's clock, want %v", left, lease)
		}
		// The owner notices, before it stores anything.
		skew(t, -(bound + margin))
		if err := s.Renew(ctx, k, c.Token, lease); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("the owner's renewal = %v, want ErrNotOwner", err)
		}
		if err := s.Complete(ctx, k, c, testResponse("late"), time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("the owner's Complete = %v, want ErrNotOwner", err)
		}
	})
}
