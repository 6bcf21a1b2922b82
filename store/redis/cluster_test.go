package redis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// openCluster returns a store on the cluster whose keys no other test
// shares. Several addresses without master_name select Cluster mode.
func openCluster(t testing.TB, cl *testredis.Cluster, prefix string) *Store {
	t.Helper()
	s := storetest.Provision(t, &Store{Addresses: cl.Addrs(), KeyPrefix: prefix})
	if _, ok := s.client.(*goredis.ClusterClient); !ok {
		t.Fatalf("%d addresses gave a %T, want a cluster client", len(cl.Addrs()), s.client)
	}
	return s
}

// keyInSlot returns a random store key that s stores in slot.
func keyInSlot(t testing.TB, s *Store, slot int) store.Key {
	t.Helper()
	for range 1 << 20 {
		k := storetest.NewKey()
		if testredis.KeySlot(s.key(k)) == slot {
			return k
		}
	}
	t.Fatalf("no key found in slot %d", slot)
	return store.Key{}
}

func testResponse(body string) *store.Response {
	return &store.Response{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(body)}
}

// mustClaim acquires k for a fresh claim and fails unless it was claimed.
func mustClaimKey(t testing.TB, s *Store, k store.Key) *store.Claim {
	t.Helper()
	c := claim()
	if rec, err := acquireRecord(context.Background(), s, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v; want a claim", rec, err)
	}
	return c
}

// wantRecord acquires k and fails unless it finds a record in state, with
// body (completed) or owned by tok (in progress).
func wantStoredRecord(t testing.TB, s *Store, k store.Key, state store.State, body string, tok store.Token) {
	t.Helper()
	rec, err := acquireRecord(context.Background(), s, k, claim())
	switch {
	case err != nil:
		t.Fatalf("Acquire: %v", err)
	case rec == nil:
		t.Fatalf("Acquire claimed the key, want a %v record", state)
	case rec.State != state:
		t.Fatalf("record state %v, want %v", rec.State, state)
	case state == store.Completed && string(rec.Body) != body:
		t.Fatalf("replayed body %q, want %q", rec.Body, body)
	case state == store.InProgress && rec.Token != tok:
		t.Fatal("in-progress record has another owner")
	}
}

// TestCluster runs the contract and the slot tests on one 3-master
// cluster that they share (each with its own key prefix).
func TestCluster(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	t.Run("KeySlotMatchesRedis", func(t *testing.T) { testClusterKeySlot(t, cl) })
	t.Run("Contract", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return openCluster(t, cl, "test:"+t.Name()) })
		storetest.RunTakeover(t, func(t *testing.T) store.Store { return openCluster(t, cl, "test:"+t.Name()) })
	})
	t.Run("KeysSpreadAndScriptsRunEverywhere", func(t *testing.T) { testClusterSpread(t, cl) })
	t.Run("Inspector", func(t *testing.T) {
		storetest.RunInspector(t, func(t *testing.T) store.Store { return openCluster(t, cl, "test:"+t.Name()) })
	})
	t.Run("ContractWithLocalCache", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return live(t, storetest.Provision(t, &Store{Addresses: cl.Addrs(), KeyPrefix: "test:" + t.Name(), LocalCache: 1 << 20}))
		})
	})
	t.Run("Events", func(t *testing.T) { testClusterEvents(t, cl) })
	t.Run("EvictionPolicy", func(t *testing.T) { testClusterEvictionPolicy(t, cl) })
	// Last: it moves a slot.
	t.Run("EventsFollowTheirSlot", func(t *testing.T) { testClusterEventsFollowTheirSlot(t, cl) })
}

func testClusterKeySlot(t *testing.T, cl *testredis.Cluster) {
	ctx := context.Background()
	for _, key := range []string{"", "a", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}",
		"idempotency:{" + storetest.NewKey().String() + "}"} {
		want, err := cl.Node(0).ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := testredis.KeySlot(key); got != int(want) {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
		}
	}
}

// Keys spread over every master, and every command and script of the
// store runs on each of them: a script that touched a second key, or a key
// outside its KEYS, would fail with CROSSSLOT or a non-local key error.
func testClusterSpread(t *testing.T, cl *testredis.Cluster) {
	s := openCluster(t, cl, "spread")
	ctx := context.Background()
	const n = 120
	slots := make(map[int]bool)
	owners := make(map[int]int)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	keys := make([]store.Key, n)
	for i := range n {
		keys[i] = storetest.NewKey()
		slot := testredis.KeySlot(s.key(keys[i]))
		slots[slot] = true
		owners[cl.SlotOwner(t, slot)]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				k, c := keys[i], claim()
				if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
					return fmt.Errorf("Acquire = %+v, %v", rec, err)
				}
				if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
					return fmt.Errorf("Renew: %w", err)
				}
				if i%2 == 1 {
					// Released keys are claimable again.
					if err := s.Release(ctx, k, c.Token); err != nil {
						return fmt.Errorf("Release: %w", err)
					}
					c = claim()
					if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
						return fmt.Errorf("Acquire after Release = %+v, %v", rec, err)
					}
				}
				if err := s.Complete(ctx, k, c, testResponse(strconv.Itoa(i)), time.Minute); err != nil {
					return fmt.Errorf("Complete: %w", err)
				}
				rec, err := acquireRecord(ctx, s, k, claim())
				if err != nil || rec == nil || string(rec.Body) != strconv.Itoa(i) {
					return fmt.Errorf("replay = %+v, %v", rec, err)
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if len(owners) != 3 || len(slots) < n/2 {
		t.Fatalf("%d keys landed in %d slots on %d masters, want them spread over all 3", n, len(slots), len(owners))
	}
	// Every key is on the master that serves its slot, and only there.
	for i, k := range keys {
		owner := cl.SlotOwner(t, testredis.KeySlot(s.key(k)))
		for node := range 3 {
			exists, err := cl.Node(node).Exists(ctx, s.key(k)).Result()
			if err != nil && node == owner {
				t.Fatalf("EXISTS on node %d: %v", node, err)
			}
			if (node == owner) != (exists == 1) {
				t.Fatalf("key %d: EXISTS on node %d = %d, owner is %d", i, node, exists, owner)
			}
		}
	}
	t.Logf("%d keys in %d slots, per master: %v", n, len(slots), owners)
}

// A slot moves to another master while keys in it are claimed, completed
// and new: go-redis follows ASK during the migration and MOVED after it,
// and the store's answers never change.
func TestClusterSlotMigration(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	s := openCluster(t, cl, "migrate")
	ctx := context.Background()

	a := storetest.NewKey()
	slot := testredis.KeySlot(s.key(a))
	b, c := keyInSlot(t, s, slot), keyInSlot(t, s, slot)
	from := cl.SlotOwner(t, slot)
	to := (from + 1) % 3

	ca := mustClaimKey(t, s, a) // in flight across the migration
	cb := mustClaimKey(t, s, b) // completed before it
	if err := s.Complete(ctx, b, cb, testResponse("b"), time.Minute); err != nil {
		t.Fatal(err)
	}

	cl.BeginMigration(t, slot, from, to)
	// Keys still on the source are served there.
	wantStoredRecord(t, s, a, store.InProgress, "", ca.Token)
	wantStoredRecord(t, s, b, store.Completed, "b", store.Token{})
	// A key the source does not have is claimed on the target (ASK).
	cc := mustClaimKey(t, s, c)
	conn := cl.Node(to).Conn()
	defer conn.Close()
	var exists *goredis.IntCmd
	if _, err := conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.Do(ctx, "ASKING")
		exists = p.Exists(ctx, s.key(c))
		return nil
	}); err != nil || exists.Val() != 1 {
		t.Fatalf("new key not on the importing node: %v %v", exists.Val(), err)
	}
	wantStoredRecord(t, s, c, store.InProgress, "", cc.Token)

	// The in-flight and completed keys move; the owner renews and
	// completes through ASK, which also makes the scripts load on the
	// target (NOSCRIPT, then EVAL).
	cl.MoveKeys(t, from, to, s.key(a), s.key(b))
	if keys := cl.SlotKeys(t, from, slot); len(keys) != 0 {
		t.Fatalf("keys left on the source: %v", keys)
	}
	if err := s.Renew(ctx, a, ca.Token, time.Minute); err != nil {
		t.Fatalf("Renew during the migration: %v", err)
	}
	if err := s.Complete(ctx, a, &store.Claim{Token: storetest.NewToken()}, testResponse("stranger"), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by a stranger during the migration = %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx, a, ca, testResponse("a"), time.Minute); err != nil {
		t.Fatalf("Complete during the migration: %v", err)
	}
	wantStoredRecord(t, s, a, store.Completed, "a", store.Token{})
	wantStoredRecord(t, s, b, store.Completed, "b", store.Token{})

	cl.FinishMigration(t, slot, from, to)
	if owner := cl.SlotOwner(t, slot); owner != to {
		t.Fatalf("slot %d is on node %d after the migration, want %d", slot, owner, to)
	}
	// The client's slot map is stale now: MOVED, then the new owner.
	wantStoredRecord(t, s, a, store.Completed, "a", store.Token{})
	wantStoredRecord(t, s, b, store.Completed, "b", store.Token{})
	if err := s.Complete(ctx, c, cc, testResponse("c"), time.Minute); err != nil {
		t.Fatalf("Complete after the migration: %v", err)
	}
	wantStoredRecord(t, s, c, store.Completed, "c", store.Token{})
	for node := range 3 {
		n, err := cl.Node(node).DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int64{true: 3, false: 0}[node == to]; n != want {
			t.Fatalf("node %d holds %d keys, want %d", node, n, want)
		}
	}
}

// A master hands over to its replica (manual CLUSTER FAILOVER, which
// waits until the replica has every acknowledged write) between the claim
// and the completion of a request: the owner completes on the new master
// through a MOVED redirect, the claim and the stored record survive, and
// the old master, now a replica, refuses nothing it should not.
func TestClusterFailoverDuringRequest(t *testing.T) {
	cl := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Replicas: true})
	s := openCluster(t, cl, "failover")
	ctx := context.Background()

	k := storetest.NewKey()
	slot := testredis.KeySlot(s.key(k))
	oldMaster := cl.SlotOwner(t, slot)
	replica := oldMaster + 3
	done := storetest.NewKey()
	for testredis.KeySlot(s.key(done)) == slot || cl.SlotOwner(t, testredis.KeySlot(s.key(done))) != oldMaster {
		done = storetest.NewKey() // another slot of the same master
	}

	c := mustClaimKey(t, s, k)
	cd := mustClaimKey(t, s, done)
	if err := s.Complete(ctx, done, cd, testResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	cl.Failover(t, replica)
	t.Logf("manual failover took %v", time.Since(start))
	if owner := cl.SlotOwner(t, slot); owner != replica || cl.IsMaster(t, oldMaster) {
		t.Fatalf("slot %d on node %d after the failover, want the replica %d", slot, owner, replica)
	}

	// The duplicate and the owner, through a stale slot map.
	wantStoredRecord(t, s, k, store.InProgress, "", c.Token)
	if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
		t.Fatalf("Renew after the failover: %v", err)
	}
	if err := s.Complete(ctx, k, c, testResponse("k"), time.Minute); err != nil {
		t.Fatalf("Complete after the failover: %v", err)
	}
	wantStoredRecord(t, s, k, store.Completed, "k", store.Token{})
	wantStoredRecord(t, s, done, store.Completed, "done", store.Token{})

	// The old master replicates the result from the new one.
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn := cl.Node(oldMaster).Conn()
		var val *goredis.StringCmd
		_, err := conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.ReadOnly(ctx)
			val = p.Get(ctx, s.key(k))
			return nil
		})
		conn.Close()
		if err == nil {
			if rec, err := store.DecodeRecord([]byte(val.Val())); err == nil && rec.State == store.Completed {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old master never replicated the completed record: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A master without a replica crashes. Calls on its slots fail with
// ErrUnavailable within a bound, never with a false answer; calls on the
// other masters' slots work until the cluster, after cluster-node-timeout
// (2s here), declares itself down (full coverage is required by default),
// and then fail the same way.
func TestClusterMasterCrash(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	s := storetest.Provision(t, failFast(&Store{
		Addresses: cl.Addrs(),
		KeyPrefix: "crash",
	}))
	ctx := context.Background()
	// A claimed key on every master.
	keys := make(map[int]store.Key)
	for len(keys) < 3 {
		k := storetest.NewKey()
		owner := cl.SlotOwner(t, testredis.KeySlot(s.key(k)))
		if _, ok := keys[owner]; !ok {
			mustClaimKey(t, s, k)
			keys[owner] = k
		}
	}

	cl.Kill(0)
	killed := time.Now()
	var okOthers, failedOthers int
	for time.Since(killed) < 3*time.Second {
		for node, k := range keys {
			start := time.Now()
			rec, err := acquireRecord(ctx, s, k, claim())
			took := time.Since(start)
			if took > 1500*time.Millisecond {
				t.Errorf("Acquire on node %d's slot took %v after the crash", node, took)
			}
			switch {
			case err != nil && !errors.Is(err, store.ErrUnavailable):
				t.Fatalf("Acquire on node %d's slot = %v, want ErrUnavailable", node, err)
			case err == nil && node == 0:
				t.Fatalf("Acquire on the dead node's slot answered %+v", rec)
			case err == nil && (rec == nil || rec.State != store.InProgress):
				t.Fatalf("Acquire of a claimed key on node %d = %+v, want the claim", node, rec)
			case err == nil:
				okOthers++
			case node != 0:
				failedOthers++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("within 3s of the crash: %d calls on the live masters answered, %d failed once the cluster was down",
		okOthers, failedOthers)
}
