package redis

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// instances returns two stores on addrs with one key prefix but clients of
// their own, as two Caddy instances would have: the options differ only in
// pool_size, which gives each its own client, hence its own subscription.
func instances(t testing.TB, addrs []string, prefix string, localCache int64) (a, b *Store) {
	t.Helper()
	a = storetest.Provision(t, &Store{Addresses: addrs, KeyPrefix: prefix, PoolSize: 7, LocalCache: localCache})
	b = storetest.Provision(t, &Store{Addresses: addrs, KeyPrefix: prefix, PoolSize: 8, LocalCache: localCache})
	if a.client == b.client || a.events == b.events {
		t.Fatal("the two instances share a client")
	}
	return a, b
}

// A waiter on one instance is woken when the owner on another completes or
// releases the claim, and by a purge.
func TestNotifyWakesWaitersOfAnotherInstance(t *testing.T) {
	srv := testredis.Start(t)
	waiter, owner := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 0)
	storetest.NotifyWakes(t, waiter, owner)
}

// Notify arranges nothing for a claim that has already ended, and says so.
func TestNotifyReportsAnEndedClaim(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	if storetest.Notify(t, s, k) {
		t.Fatal("Notify of an absent key reported a claim in progress")
	}
	s.Acquire(ctx, k, c)
	if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if storetest.Notify(t, s, k) {
		t.Fatal("Notify of a completed key reported a claim in progress")
	}
	if flags(t, srv, s, k)&store.FlagWatched != 0 {
		t.Fatal("Notify marked a completed record")
	}
}

// flags is the flags byte of k's value.
func flags(t testing.TB, srv *testredis.Server, s *Store, k store.Key) byte {
	t.Helper()
	b, err := srv.Client().GetRange(context.Background(), s.key(k), int64(store.FlagsOffset), int64(store.FlagsOffset)).Bytes()
	if err != nil || len(b) != 1 {
		t.Fatalf("reading the flags of %s: %q, %v", s.key(k), b, err)
	}
	return b[0]
}

// The watched flag is set in the claim itself, which keeps its expiry,
// its owner and its binding: the owner renews and completes it as before.
func TestWatchedFlagKeepsTheClaim(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	c.Lease = 10 * time.Second
	s.Acquire(ctx, k, c)
	for range 2 { // a second waiter finds the flag set
		if !storetest.Notify(t, s, k) {
			t.Fatal("Notify found no claim in progress")
		}
	}
	if flags(t, srv, s, k) != store.FlagWatched {
		t.Fatalf("flags %08b, want the watched flag alone", flags(t, srv, s, k))
	}
	if ttl, err := srv.Client().PTTL(ctx, s.key(k)).Result(); err != nil || ttl <= keyLife(c)-5*time.Second || ttl > keyLife(c) {
		t.Fatalf("the watched claim's TTL is %v, %v; want its 10s lease and the trace after it, %v", ttl, err, keyLife(c))
	}
	rec, err := acquireRecord(ctx, s, k, claim())
	if err != nil || rec == nil || rec.State != store.InProgress || rec.Token != c.Token || rec.Endpoint != c.Endpoint || rec.Fingerprint != c.Fingerprint {
		t.Fatalf("the watched claim reads as %+v, %v", rec, err)
	}
	if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
		t.Fatalf("Renew of a watched claim: %v", err)
	}
	if err := s.Complete(ctx, k, c, testResponse("done"), time.Minute); err != nil {
		t.Fatalf("Complete of a watched claim: %v", err)
	}
	if flags(t, srv, s, k)&store.FlagWatched != 0 {
		t.Fatal("the completed record kept the watched flag")
	}
}

// Nobody waits: a completion publishes nothing. Someone waits: the
// completion publishes once, one more round trip.
func TestPublishesOnlyWhenSomeoneWaits(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	ctx := context.Background()
	run := func(wait bool) map[string]int64 {
		k, c := storetest.NewKey(), claim()
		s.Acquire(ctx, k, c)
		if wait {
			storetest.Notify(t, s, k)
		}
		return commands(t, srv, func() {
			if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute); err != nil {
				t.Fatal(err)
			}
		})
	}
	run(false) // loads the script
	script := map[string]int64{"evalsha": 1, "getrange": 1, "set": 1}
	if got := run(false); !maps.Equal(got, script) {
		t.Fatalf("a completion nobody waited for ran %v, want %v", got, script)
	}
	script["publish"] = 1
	if got := run(true); !maps.Equal(got, script) {
		t.Fatalf("a completion someone waited for ran %v, want %v", got, script)
	}
}

// A killed Redis drops the subscription: the loss is counted, Notify
// refuses until it is back, and it comes back by itself.
func TestSubscriptionLossIsCountedAndRecovers(t *testing.T) {
	srv := testredis.Start(t)
	waiter, owner := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 0)
	vec, err := store.SubscriptionLosses(nil)
	if err != nil {
		t.Fatal(err)
	}
	losses := vec.WithLabelValues(waiter.name)
	storetest.Notify(t, waiter, storetest.NewKey()) // starts the subscription
	before := testutil.ToFloat64(losses)

	srv.Kill()
	waitFor(t, "the loss to be counted", func() bool { return testutil.ToFloat64(losses) == before+1 })
	if _, err := waiter.Notify(context.Background(), storetest.NewKey()); !errors.Is(err, store.ErrNotListening) {
		t.Fatalf("Notify while the subscription is down = %v, want ErrNotListening", err)
	}
	srv.Restart(t)
	storetest.NotifyWakes(t, waiter, owner)
	if got := testutil.ToFloat64(losses); got != before+1 {
		t.Fatalf("%v losses counted for one kill", got-before)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// On a Cluster the subscription is sharded: SSUBSCRIBE on the master of
// the events channel's slot, and SPUBLISH to it.
func testClusterEvents(t *testing.T, cl *testredis.Cluster) {
	waiter, owner := instances(t, cl.Addrs(), "events", 0)
	if !waiter.events.sharded.Load() {
		t.Fatal("a cluster client does not use sharded Pub/Sub")
	}
	node := cl.SlotOwner(t, testredis.KeySlot(waiter.channel))
	before := nodeCalls(t, cl, node, "spublish")
	storetest.NotifyWakes(t, waiter, owner)
	if got := nodeCalls(t, cl, node, "spublish") - before; got != 3 {
		t.Fatalf("the master of the channel's slot ran SPUBLISH %d times for 3 announcements", got)
	}
	if got := nodeCalls(t, cl, node, "ssubscribe"); got == 0 {
		t.Fatal("the master of the channel's slot saw no SSUBSCRIBE")
	}
}

// When the events channel's slot moves, Redis unsubscribes the sharded
// subscribers, and the subscription follows the slot to its new master.
func testClusterEventsFollowTheirSlot(t *testing.T, cl *testredis.Cluster) {
	waiter, owner := instances(t, cl.Addrs(), "moving", 0)
	storetest.Notify(t, waiter, storetest.NewKey())
	vec, _ := store.SubscriptionLosses(nil)
	losses := vec.WithLabelValues(waiter.name)
	before := testutil.ToFloat64(losses)

	slot := testredis.KeySlot(waiter.channel)
	from := cl.SlotOwner(t, slot)
	to := (from + 1) % 3
	cl.BeginMigration(t, slot, from, to)
	cl.MoveKeys(t, from, to, cl.SlotKeys(t, from, slot)...)
	cl.FinishMigration(t, slot, from, to)
	waitFor(t, "the server to unsubscribe the moved channel", func() bool { return testutil.ToFloat64(losses) > before })
	storetest.NotifyWakes(t, waiter, owner)
	if got := nodeCalls(t, cl, to, "ssubscribe"); got == 0 {
		t.Fatal("the slot's new master saw no SSUBSCRIBE")
	}
}

// A Cluster without sharded Pub/Sub (here its commands are renamed away)
// gets plain Pub/Sub, which the Cluster broadcasts.
func TestClusterWithoutShardedPubSub(t *testing.T) {
	cl := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3,
		Args: []string{"--rename-command", "SSUBSCRIBE", "", "--rename-command", "SPUBLISH", ""}})
	waiter, owner := instances(t, cl.Addrs(), "plain", 0)
	storetest.NotifyWakes(t, waiter, owner)
	if waiter.events.sharded.Load() || owner.events.sharded.Load() {
		t.Fatal("a client still uses sharded Pub/Sub")
	}
}

// nodeCalls is how many times node i ran cmd.
func nodeCalls(t testing.TB, cl *testredis.Cluster, i int, cmd string) int64 {
	t.Helper()
	info, err := cl.Node(i).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}
