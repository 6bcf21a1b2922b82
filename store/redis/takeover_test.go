package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// leaseEnd is the lease end in the head of k's claim.
func leaseEnd(t testing.TB, srv *testredis.Server, s *Store, k store.Key) time.Time {
	t.Helper()
	head, err := srv.Client().GetRange(context.Background(), s.key(k), 0, int64(store.FlagsOffset)).Bytes()
	if err != nil || store.Encoded(head).State() != store.InProgress {
		t.Fatalf("reading the head of %s: %q, %v", s.key(k), head, err)
	}
	return store.Encoded(head).ExpiresAt()
}

func pttl(t testing.TB, srv *testredis.Server, s *Store, k store.Key) time.Duration {
	t.Helper()
	d, err := srv.Client().PTTL(context.Background(), s.key(k)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The head records the lease end, and the key lasts as long again as the
// record would: lease plus TTL.
func TestClaimOutlivesItsLease(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	k, c := storetest.NewKey(), claim()
	c.Lease, c.TTL = 10*time.Second, time.Hour
	before := time.Now()
	if rec, err := acquireRecord(context.Background(), s, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v; want a claim", rec, err)
	}
	if end := leaseEnd(t, srv, s, k); end.Before(before.Add(c.Lease)) || end.After(time.Now().Add(c.Lease)) {
		t.Fatalf("lease end %v, want %v from the claim", end, c.Lease)
	}
	if d := pttl(t, srv, s, k); d <= c.Lease+c.TTL-5*time.Second || d > c.Lease+c.TTL {
		t.Fatalf("key expiry %v, want the lease and the TTL, %v", d, c.Lease+c.TTL)
	}
}

// An owner dies: its claim stays past its lease, and the retry takes it
// over and says so; the dead owner can no longer end it; and the next
// request finds the new claim, no takeover.
func TestTakeoverOfADeadOwner(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	k, dead := storetest.NewKey(), claim()
	dead.Lease, dead.TTL = 100*time.Millisecond, time.Hour
	if _, err := s.Acquire(ctx, k, dead); err != nil {
		t.Fatal(err)
	}
	// Within the lease, a claim is no takeover.
	if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record == nil || got.Record.Token != dead.Token || got.TookOver {
		t.Fatalf("Acquire within the lease = %+v, %v; want the claim, no takeover", got, err)
	}
	time.Sleep(dead.Lease + 50*time.Millisecond)
	if n, err := srv.Client().Exists(ctx, s.key(k)).Result(); err != nil || n != 1 {
		t.Fatalf("the dead claim's key: %d, %v; want it kept past its lease", n, err)
	}
	// The admin API sees no live record, and no claim in flight.
	if rec, _, err := s.Lookup(ctx, k); rec != nil || err != nil {
		t.Fatalf("Lookup of a dead claim = %+v, %v; want none", rec, err)
	}
	if entries, err := s.InFlight(ctx, 0, 100); err != nil || len(entries) != 0 {
		t.Fatalf("InFlight = %+v, %v; want no dead claim", entries, err)
	}

	next := claim()
	next.TTL = time.Hour
	got, err := s.Acquire(ctx, k, next)
	if err != nil || got.Record != nil || !got.TookOver {
		t.Fatalf("Acquire after the lease = %+v, %v; want a takeover", got, err)
	}
	if err := s.Complete(ctx, k, dead, testResponse("late"), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("the dead owner's Complete = %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, k, dead.Token, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("the dead owner's Renew = %v, want ErrNotOwner", err)
	}
	if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record == nil || got.Record.Token != next.Token || got.TookOver {
		t.Fatalf("Acquire after the takeover = %+v, %v; want the new claim, no takeover", got, err)
	}
	if d := pttl(t, srv, s, k); d <= keyLife(next)-5*time.Second || d > keyLife(next) {
		t.Fatalf("the new claim's key expiry %v, want %v", d, keyLife(next))
	}
}

// takeoverHook runs before each takeover script, as another instance
// would act between the SET NX GET that found a dead claim and the script.
type takeoverHook struct{ before func() }

func (h *takeoverHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *takeoverHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.seen(cmd)
		return next(ctx, cmd)
	}
}

func (h *takeoverHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			h.seen(cmd)
		}
		return next(ctx, cmds)
	}
}

// seen runs before on a takeover or a conversion into an unknown outcome,
// sent as EVALSHA: the test loads the scripts first.
func (h *takeoverHook) seen(cmd goredis.Cmder) {
	if args := cmd.Args(); len(args) > 1 && args[0] == "evalsha" && (args[1] == takeoverScript.Hash() || args[1] == unknownScript.Hash()) {
		h.before()
	}
}

// loadTakeoverScripts loads the scripts that takeoverHook sees.
func loadTakeoverScripts(t testing.TB, srv *testredis.Server) {
	t.Helper()
	for _, script := range []*goredis.Script{takeoverScript, unknownScript} {
		if err := script.Load(context.Background(), srv.Client()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// A takeover that finds the key changed since the SET NX GET read it leaves
// it, and decides again from what it holds now.
func TestTakeoverFindsTheKeyChanged(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	loadTakeoverScripts(t, srv)
	hook := &takeoverHook{before: func() {}}
	s.client.AddHook(hook)
	deadClaim := func(t *testing.T) (store.Key, *store.Claim) {
		k, c := storetest.NewKey(), claim()
		c.Lease = 50 * time.Millisecond
		if _, err := s.Acquire(ctx, k, c); err != nil {
			t.Fatal(err)
		}
		time.Sleep(c.Lease + 20*time.Millisecond)
		return k, c
	}
	// Another instance: a client of its own (another pool size), without the hook.
	other := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: s.KeyPrefix, PoolSize: 2})

	t.Run("taken over by another", func(t *testing.T) {
		k, _ := deadClaim(t)
		winner := claim()
		hook.before = func() {
			hook.before = func() {}
			if got, err := other.Acquire(ctx, k, winner); err != nil || !got.TookOver {
				t.Errorf("the other instance's takeover = %+v, %v", got, err)
			}
		}
		got, err := s.Acquire(ctx, k, claim())
		if err != nil || got.Record == nil || got.Record.Token != winner.Token || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want the winner's claim, no takeover", got, err)
		}
	})
	t.Run("renewed by its owner", func(t *testing.T) {
		k, owner := deadClaim(t)
		hook.before = func() {
			hook.before = func() {}
			if err := other.Renew(ctx, k, owner.Token, time.Minute); err != nil {
				t.Errorf("Renew: %v", err)
			}
		}
		got, err := s.Acquire(ctx, k, claim())
		if err != nil || got.Record == nil || got.Record.Token != owner.Token || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want the renewed claim, no takeover", got, err)
		}
	})
	t.Run("completed", func(t *testing.T) {
		k, owner := deadClaim(t)
		hook.before = func() {
			hook.before = func() {}
			if err := other.Complete(ctx, k, owner, testResponse("late but done"), time.Minute); err != nil {
				t.Errorf("Complete: %v", err)
			}
		}
		got, err := s.Acquire(ctx, k, claim())
		if err != nil || got.Record == nil || got.Record.State != store.Completed || string(got.Record.Body) != "late but done" {
			t.Fatalf("Acquire = %+v, %v; want the completed record", got, err)
		}
	})
	t.Run("released", func(t *testing.T) {
		k, owner := deadClaim(t)
		hook.before = func() {
			hook.before = func() {}
			if err := other.Release(ctx, k, owner.Token); err != nil {
				t.Errorf("Release: %v", err)
			}
		}
		if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record != nil || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want a claim of the freed key, no takeover", got, err)
		}
	})
	t.Run("watched", func(t *testing.T) {
		// A waiter's flag is no change of claim.
		k, _ := deadClaim(t)
		hook.before = func() {
			hook.before = func() {}
			if err := srv.Client().SetRange(ctx, s.key(k), int64(store.FlagsOffset), string([]byte{store.FlagWatched})).Err(); err != nil {
				t.Error(err)
			}
		}
		if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record != nil || !got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want a takeover", got, err)
		}
	})
	t.Run("dead again", func(t *testing.T) {
		// Each takeover finds another dead claim: Acquire gives up after
		// maxTakeovers and answers the claim as in flight.
		k, _ := deadClaim(t)
		tries := 0
		var last *store.Claim
		hook.before = func() {
			tries++
			last = claim()
			last.Lease = time.Millisecond
			blob := appendClaim(nil, last)
			if err := srv.Client().Set(ctx, s.key(k), blob, time.Minute).Err(); err != nil {
				t.Error(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		got, err := s.Acquire(ctx, k, claim())
		hook.before = func() {}
		if err != nil || got.Record == nil || got.Record.Token != last.Token || got.TookOver || tries != maxTakeovers {
			t.Fatalf("Acquire = %+v, %v after %d takeovers; want the last dead claim after %d", got, err, tries, maxTakeovers)
		}
	})
}

// Renew moves the lease end in the head and the key's expiry by as much:
// the trace after the lease stays as long, renewal after renewal.
func TestRenewMovesTheLeaseEnd(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	c.Lease, c.TTL = time.Second, time.Hour
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	// trace is how long the key outlives the lease.
	trace := func() time.Duration {
		t.Helper()
		end := leaseEnd(t, srv, s, k)
		return pttl(t, srv, s, k) - time.Until(end)
	}
	within := func(what string, got, want, tolerance time.Duration) {
		t.Helper()
		if got < want-tolerance || got > want+tolerance {
			t.Fatalf("%s = %v, want %v ± %v", what, got, want, tolerance)
		}
	}
	within("the trace after the claim", trace(), c.TTL, 100*time.Millisecond)
	first := trace()

	for _, lease := range []time.Duration{time.Minute, 10 * time.Second, time.Hour} {
		before := time.Now()
		if err := s.Renew(ctx, k, c.Token, lease); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		within("the renewed lease", leaseEnd(t, srv, s, k).Sub(before), lease, 100*time.Millisecond)
		within("the trace after a renewal", trace(), c.TTL, 100*time.Millisecond)
	}
	for range 50 {
		if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
			t.Fatalf("Renew: %v", err)
		}
	}
	// Each renewal moves the expiry by a whole millisecond, rounded: no
	// drift beyond the reads' own.
	within("the trace after 53 renewals", trace(), first, 30*time.Millisecond)

	// A renewal may shorten the lease: once it passes, the claim is taken
	// over, its trace still there.
	if err := s.Renew(ctx, k, c.Token, 100*time.Millisecond); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	within("the trace after a short renewal", trace(), c.TTL, 100*time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	if got, err := s.Acquire(ctx, k, claim()); err != nil || got.Record != nil || !got.TookOver {
		t.Fatalf("Acquire after the renewed lease passed = %+v, %v; want a takeover", got, err)
	}
}

// The listing and Lookup give a claim's lease end from its head, not the
// key's expiry, which is later by the trace.
func TestInspectorReadsTheLeaseEnd(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	base := time.Now().Truncate(time.Millisecond)
	now = func() time.Time { return base }
	t.Cleanup(func() { now = time.Now })
	k, c := storetest.NewKey(), claim()
	c.CreatedAt = base.Add(-time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	want := base.Add(c.Lease)
	if _, exp, err := s.Lookup(ctx, k); err != nil || !exp.Equal(want) {
		t.Fatalf("Lookup's lease end %v, %v; want %v", exp, err, want)
	}
	entries, err := s.InFlight(ctx, time.Second, 10)
	if err != nil || len(entries) != 1 || entries[0].Key != k || !entries[0].ExpiresAt.Equal(want) {
		t.Fatalf("InFlight = %+v, %v; want the claim, its lease ending %v", entries, err, want)
	}
	// Past the lease, by this clock: the claim is dead, listed nowhere,
	// and a purge finds no live record (but deletes the trace).
	base = want
	if rec, _, err := s.Lookup(ctx, k); rec != nil || err != nil {
		t.Fatalf("Lookup of the dead claim = %+v, %v", rec, err)
	}
	if entries, err := s.InFlight(ctx, time.Second, 10); err != nil || len(entries) != 0 {
		t.Fatalf("InFlight = %+v, %v; want nothing", entries, err)
	}
	if found, err := s.Delete(ctx, k); found || err != nil {
		t.Fatalf("Delete of the dead claim = %v, %v; want false", found, err)
	}
	if n, _ := srv.Client().Exists(ctx, s.key(k)).Result(); n != 0 {
		t.Fatal("Delete left the dead claim's trace")
	}
}

// leaseEndOffset is where the codec writes a record's expiry.
func TestLeaseEndOffset(t *testing.T) {
	b := store.AppendRecord(nil, &store.Record{State: store.InProgress, ExpiresAt: time.Unix(0, 0x0102030405060708)})
	if got, want := b[leaseEndOffset:leaseEndOffset+8], []byte{1, 2, 3, 4, 5, 6, 7, 8}; string(got) != string(want) {
		t.Fatalf("bytes at leaseEndOffset %d: % x; want the expiry, % x", leaseEndOffset, got, want)
	}
}
