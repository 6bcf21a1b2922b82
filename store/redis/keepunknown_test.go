package redis

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// keepClaim is a retry's claim with on_unknown_outcome keep.
func keepClaim() *store.Claim {
	c := claim()
	c.TTL, c.KeepUnknown = time.Hour, true
	return c
}

// deadOwner claims a key on s and lets the claim's lease pass.
func deadOwner(t testing.TB, s *Store) (store.Key, *store.Claim) {
	t.Helper()
	k, c := storetest.NewKey(), claim()
	c.Lease, c.TTL = 50*time.Millisecond, time.Hour
	if got, err := s.Acquire(context.Background(), k, c); err != nil || got.Record != nil {
		t.Fatalf("Acquire = %+v, %v; want a claim", got, err)
	}
	time.Sleep(c.Lease + 20*time.Millisecond)
	return k, c
}

// A dead owner's claim, watched by a waiter on another instance, becomes
// its unknown outcome in the one script a takeover costs: the waiter is
// woken as by a completion, the record is kept for the TTL and in the local
// tier, and the dead owner can no longer end or renew the key.
func TestKeepUnknownTurnsTheDeadClaim(t *testing.T) {
	srv := testredis.Start(t)
	waiter, s := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 1<<20)
	live(t, waiter)
	live(t, s)
	ctx := context.Background()
	loadTakeoverScripts(t, srv)
	k, dead := deadOwner(t, s)
	ended, stop := store.AwaitEnd(k)
	defer stop()
	if !storetest.Notify(t, waiter, k) {
		t.Fatal("Notify found no claim in progress")
	}

	retry := keepClaim()
	var got store.Acquired
	var err error
	ran := commands(t, srv, func() { got, err = s.Acquire(ctx, k, retry) })
	if err != nil || got.Record == nil || !got.TookOver || !got.Record.OutcomeUnknown || got.Record.Token != retry.Token ||
		got.Record.Fingerprint != dead.Fingerprint || !got.Record.CreatedAt.Equal(dead.CreatedAt) {
		t.Fatalf("Acquire with KeepUnknown = %+v, %v; want the dead claim's unknown outcome, under the retry's token", got, err)
	}
	// The SET NX GET, the script (its GET, TIME and SET), and the end's PUBLISH.
	if want := map[string]int64{"set": 2, "evalsha": 1, "get": 1, "time": 1, "publish": 1}; !maps.Equal(ran, want) {
		t.Errorf("the conversion ran %v, want %v", ran, want)
	}
	storetest.WantWoken(t, ended, "the conversion of a watched dead claim")
	if d := pttl(t, srv, s, k); d <= retry.TTL-5*time.Second || d > retry.TTL {
		t.Errorf("the unknown outcome's key expiry %v, want the TTL, %v", d, retry.TTL)
	}
	if ran := commands(t, srv, func() { replay(t, s, k) }); len(ran) != 0 {
		t.Errorf("a replay of the unknown outcome ran %v, want it from the tier", ran)
	}
	if err := s.Complete(ctx, k, dead, testResponse("late"), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("the dead owner's Complete = %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, k, dead.Token, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("the dead owner's Renew = %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx, k, dead.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("the dead owner's Release = %v, want ErrNotOwner", err)
	}
}

// The conversion, like a takeover, acts only on the dead claim it read:
// whatever another instance or the owner did meanwhile is decided again.
func TestKeepUnknownFindsTheKeyChanged(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	loadTakeoverScripts(t, srv)
	hook := &takeoverHook{before: func() {}}
	s.client.AddHook(hook)
	// Another instance: a client of its own (another pool size), without the hook.
	other := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: s.KeyPrefix, PoolSize: 2})
	once := func(f func()) { hook.before = func() { hook.before = func() {}; f() } }

	t.Run("released", func(t *testing.T) {
		// The key is free: claimed with SET NX GET, no takeover.
		k, owner := deadOwner(t, s)
		once(func() {
			if err := other.Release(ctx, k, owner.Token); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
		retry := keepClaim()
		if got, err := s.Acquire(ctx, k, retry); err != nil || got.Record != nil || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want a claim of the freed key, no takeover", got, err)
		}
		if rec, err := acquireRecord(ctx, other, k, claim()); err != nil || rec == nil || rec.Token != retry.Token {
			t.Fatalf("the key after = %+v, %v; want the retry's claim", rec, err)
		}
	})
	t.Run("turned by another", func(t *testing.T) {
		k, _ := deadOwner(t, s)
		first := keepClaim()
		once(func() {
			if got, err := other.Acquire(ctx, k, first); err != nil || !got.TookOver {
				t.Errorf("the other instance's conversion = %+v, %v", got, err)
			}
		})
		got, err := s.Acquire(ctx, k, keepClaim())
		if err != nil || got.Record == nil || !got.Record.OutcomeUnknown || got.Record.Token != first.Token || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want the other's unknown outcome, no takeover", got, err)
		}
	})
	t.Run("completed by its owner", func(t *testing.T) {
		k, owner := deadOwner(t, s)
		once(func() {
			if err := other.Complete(ctx, k, owner, testResponse("late but done"), time.Minute); err != nil {
				t.Errorf("Complete: %v", err)
			}
		})
		got, err := s.Acquire(ctx, k, keepClaim())
		if err != nil || got.Record == nil || got.Record.OutcomeUnknown || string(got.Record.Body) != "late but done" || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want the owner's response", got, err)
		}
	})
	t.Run("alive by Redis's clock", func(t *testing.T) {
		// Only this instance's clock, an hour ahead, thinks the claim dead.
		k, owner := storetest.NewKey(), claim()
		if _, err := s.Acquire(ctx, k, owner); err != nil {
			t.Fatal(err)
		}
		skew(t, time.Hour)
		got, err := s.Acquire(ctx, k, keepClaim())
		skew(t, 0)
		if err != nil || got.Record == nil || got.Record.State != store.InProgress || got.Record.Token != owner.Token || got.TookOver {
			t.Fatalf("Acquire = %+v, %v; want the running claim", got, err)
		}
	})
}

// With min_replicas the conversion waits for the replicas as a claim does;
// short of them (the replication link blackholed), it is counted and kept,
// and answered: it runs nothing, where failing would answer on_store_error.
func TestMinReplicasUnknownOutcomeShortOfReplicas(t *testing.T) {
	sg, link := testredis.StartSentinelBehindLink(t)
	s := openReplicated(t, sg, "unknown")
	ctx := context.Background()
	k, dead := deadOwner(t, s)
	before := testutil.ToFloat64(s.replicas.shortUnknown)

	link.Blackhole(true)
	got, err := s.Acquire(ctx, k, keepClaim())
	if err != nil || got.Record == nil || !got.Record.OutcomeUnknown || got.Record.Fingerprint != dead.Fingerprint || !got.TookOver {
		t.Fatalf("Acquire with KeepUnknown, no replica acknowledging = %+v, %v; want the unknown outcome", got, err)
	}
	if n := testutil.ToFloat64(s.replicas.shortUnknown) - before; n != 1 {
		t.Errorf("unknown_outcome shortfalls counted %v, want 1", n)
	}
	v, err := sg.Client(sg.InitialMasterAddr()).Get(ctx, s.key(k)).Bytes()
	if rec, derr := store.DecodeRecord(v); err != nil || derr != nil || !rec.OutcomeUnknown {
		t.Fatalf("the master's record: %v, %v; want the unknown outcome kept", err, derr)
	}
}
