package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// live waits until s's tier is in use: its subscription is up.
func live(t testing.TB, s *Store) *Store {
	t.Helper()
	waitFor(t, "the subscription", func() bool { return s.events.listening(s.channel) })
	return s
}

func openCached(t testing.TB, srv *testredis.Server, size int64) *Store {
	t.Helper()
	return live(t, storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "test:" + t.Name(), LocalCache: size}))
}

// commands runs f and returns what Redis ran meanwhile, the client's and
// the test's own administration aside.
func commands(t testing.TB, srv *testredis.Server, f func()) map[string]int64 {
	t.Helper()
	srv.ConfigResetStat(t)
	f()
	got := srv.CommandStats(t)
	for _, admin := range []string{"config|resetstat", "info", "hello", "client|setinfo", "ping"} {
		delete(got, admin)
	}
	return got
}

func complete(t testing.TB, s *Store, k store.Key, body string, ttl time.Duration) *store.Claim {
	t.Helper()
	c := mustClaimKey(t, s, k)
	if err := s.Complete(context.Background(), k, c, testResponse(body), ttl); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return c
}

func replay(t testing.TB, s *Store, k store.Key) *store.Record {
	t.Helper()
	rec, err := acquireRecord(context.Background(), s, k, claim())
	if err != nil || rec == nil || rec.State != store.Completed {
		t.Fatalf("replay Acquire = %+v, %v; want the completed record", rec, err)
	}
	return rec
}

func TestContractWithLocalCache(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store { return openCached(t, srv, 1<<20) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return openCached(t, srv, 1<<20) })
}

// A record this instance completed, or read once from Redis, is replayed
// without a command: the same record, binding included.
func TestTierReplaysWithoutRedis(t *testing.T) {
	srv := testredis.Start(t)
	a, b := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 1<<20)
	live(t, a)
	live(t, b)
	ctx := context.Background()

	k := storetest.NewKey()
	c := complete(t, a, k, "made here", time.Minute)
	var rec *store.Record
	if got := commands(t, srv, func() { rec = replay(t, a, k) }); len(got) != 0 {
		t.Fatalf("a replay of a record completed here ran %v", got)
	}
	if string(rec.Body) != "made here" || rec.Token != c.Token || rec.Endpoint != c.Endpoint ||
		rec.Fingerprint != c.Fingerprint || rec.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("the tier replayed %+v for the claim %+v", rec, c)
	}
	fromRedis, err := acquireRecord(ctx, b, k, claim())
	if err != nil || !fromRedis.ExpiresAt.Equal(rec.ExpiresAt) || string(fromRedis.Body) != string(rec.Body) {
		t.Fatalf("the same record read from Redis = %+v, %v", fromRedis, err)
	}

	// Completed elsewhere: the first replay reads Redis, the next does not.
	k2 := storetest.NewKey()
	complete(t, b, k2, "made there", time.Minute)
	if got := commands(t, srv, func() { replay(t, a, k2) }); got["set"] != 1 {
		t.Fatalf("the first replay of a record completed elsewhere ran %v, want its SET", got)
	}
	if got := commands(t, srv, func() { rec = replay(t, a, k2) }); len(got) != 0 || string(rec.Body) != "made there" {
		t.Fatalf("the second replay ran %v and gave %q", got, rec.Body)
	}
}

// Claims are never kept: each duplicate asks Redis, and sees the claim end.
func TestTierNeverKeepsAClaim(t *testing.T) {
	srv := testredis.Start(t)
	a, b := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 1<<20)
	live(t, a)
	ctx := context.Background()
	k := storetest.NewKey()
	c := mustClaimKey(t, b, k)
	for i := range 2 {
		got := commands(t, srv, func() {
			if rec, err := acquireRecord(ctx, a, k, claim()); err != nil || rec == nil || rec.State != store.InProgress {
				t.Fatalf("duplicate Acquire = %+v, %v", rec, err)
			}
		})
		if got["set"] != 1 {
			t.Fatalf("duplicate %d of a claim ran %v, want its SET", i+1, got)
		}
	}
	if err := b.Complete(ctx, k, c, testResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if rec := replay(t, a, k); string(rec.Body) != "done" {
		t.Fatalf("after the completion, replayed %q", rec.Body)
	}
}

// A purge on one instance evicts the record from the other's tier.
func TestPurgeEvictsFromEveryTier(t *testing.T) {
	srv := testredis.Start(t)
	a, b := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 1<<20)
	live(t, a)
	live(t, b)
	k := storetest.NewKey()
	complete(t, a, k, "purged", time.Minute)
	replay(t, b, k) // now in b's tier
	if got := commands(t, srv, func() { replay(t, b, k) }); len(got) != 0 {
		t.Fatalf("b's second replay ran %v", got)
	}
	if found, err := a.Delete(context.Background(), k); err != nil || !found {
		t.Fatalf("Delete = %t, %v", found, err)
	}
	waitFor(t, "b's tier to drop the purged record", func() bool { return b.tier.Get(k) == nil })
	if rec, err := acquireRecord(context.Background(), b, k, claim()); rec != nil || err != nil {
		t.Fatalf("Acquire on b after the purge = %+v, %v; want a claim", rec, err)
	}
}

// A killed Redis drops the subscription: the tier is emptied and unused
// until the subscription is back, so a restarted, empty Redis is not
// contradicted by records kept from before.
func TestRedisRestartFlushesTheTier(t *testing.T) {
	srv := testredis.Start(t)
	s := live(t, storetest.Provision(t, failFast(&Store{Addresses: []string{srv.Addr()}, LocalCache: 1 << 20})))
	k := storetest.NewKey()
	complete(t, s, k, "before the crash", time.Hour)
	replay(t, s, k)

	srv.Kill()
	waitFor(t, "the tier to be suspended", func() bool {
		_, err := s.Acquire(context.Background(), k, claim())
		return errors.Is(err, store.ErrUnavailable)
	})
	srv.Restart(t)
	live(t, s)
	if rec, err := acquireRecord(context.Background(), s, k, claim()); rec != nil || err != nil {
		t.Fatalf("Acquire after the restart = %+v, %v; want a claim in the empty Redis", rec, err)
	}
}

// Each record leaves the tier at its own expiry, when Redis drops it too.
func TestTierHonoursTheExpiry(t *testing.T) {
	srv := testredis.Start(t)
	s := openCached(t, srv, 1<<20)
	short, long := storetest.NewKey(), storetest.NewKey()
	complete(t, s, short, "short", 300*time.Millisecond)
	complete(t, s, long, "long", time.Hour)
	if got := commands(t, srv, func() { replay(t, s, short) }); len(got) != 0 {
		t.Fatalf("a replay before the expiry ran %v", got)
	}
	time.Sleep(400 * time.Millisecond)
	if rec, err := acquireRecord(context.Background(), s, short, claim()); rec != nil || err != nil {
		t.Fatalf("Acquire after the TTL = %+v, %v; want a claim", rec, err)
	}
	if got := commands(t, srv, func() { replay(t, s, long) }); len(got) != 0 {
		t.Fatalf("a replay of the long-lived record ran %v", got)
	}
}

// The tier holds at most local_cache bytes: the oldest records leave it
// first, and are then read from Redis.
func TestTierSizeBound(t *testing.T) {
	srv := testredis.Start(t)
	s := openCached(t, srv, 8<<10)
	keys := make([]store.Key, 20)
	body := strings.Repeat("x", 1000)
	for i := range keys {
		keys[i] = storetest.NewKey()
		complete(t, s, keys[i], body, time.Hour)
	}
	// Newest first: a replay read from Redis goes into the tier, evicting
	// the oldest there.
	cached := 0
	for i := len(keys) - 1; i >= 0; i-- {
		if got := commands(t, srv, func() { replay(t, s, keys[i]) }); len(got) == 0 {
			cached++
			if i < len(keys)-cached {
				t.Errorf("record %d of %d was in the tier while a newer one was not", i+1, len(keys))
			}
		}
	}
	// Each record costs its ~1.1 KB and the table's per-entry overhead.
	if cached < 4 || cached > 7 {
		t.Fatalf("%d records of 1 KB in an 8 KiB tier", cached)
	}
}

// A completed record that carries no expiry is replayed from Redis, never
// kept: the tier cannot tell how long it may live.
func TestRecordWithoutExpiryIsNotKept(t *testing.T) {
	srv := testredis.Start(t)
	s := openCached(t, srv, 1<<20)
	k := storetest.NewKey()
	old := store.AppendCompleted(nil, claim(), &store.Response{Status: 200, Body: []byte("old")}, time.Time{})
	if err := srv.Client().Set(context.Background(), s.key(k), old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := commands(t, srv, func() { replay(t, s, k) }); got["set"] != 1 {
			t.Fatalf("replay %d of a record without expiry ran %v, want its SET", i+1, got)
		}
	}
}
