package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestMinReplicasValidate(t *testing.T) {
	for _, tc := range []struct {
		s    Store
		want string // "" for valid
	}{
		{Store{MinReplicas: 1}, ""},
		{Store{MinReplicas: 2, ReplicaTimeout: caddy.Duration(500 * time.Millisecond)}, ""},
		{Store{MinReplicas: -1}, "min_replicas -1 is negative"},
		{Store{MinReplicas: 1, ReplicaTimeout: caddy.Duration(-time.Second)}, "replica_timeout -1s is negative"},
		{Store{MinReplicas: 1, ReplicaTimeout: caddy.Duration(time.Second)}, "replica_timeout 1s must be shorter than read_timeout 1s"},
		{Store{MinReplicas: 1, ReplicaTimeout: caddy.Duration(time.Second), ReadTimeout: caddy.Duration(3 * time.Second)}, ""},
		// Without min_replicas, replica_timeout is unused.
		{Store{ReplicaTimeout: caddy.Duration(5 * time.Second)}, ""},
	} {
		s := tc.s
		s.opts.Addrs = []string{defaultAddress}
		s.opts.ReadTimeout = max(time.Duration(s.ReadTimeout), defaultReadTimeout)
		err := s.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && err.Error() != tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.s, err, tc.want)
		}
	}
}

// provisionErr provisions s as Caddy would and returns the error.
func provisionErr(t *testing.T, s *Store) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	err := s.Provision(ctx)
	_ = s.Cleanup()
	return err
}

// A server that refuses WAIT (as some managed services do), or that has
// fewer replicas than min_replicas, is a config error when it answers at
// provisioning, not a silent downgrade.
func TestMinReplicasRefused(t *testing.T) {
	noWait := testredis.StartWith(t, "--rename-command", "WAIT", "")
	err := provisionErr(t, &Store{Addresses: []string{noWait.Addr()}, MinReplicas: 1})
	if err == nil || !strings.Contains(err.Error(), "min_replicas") || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("Provision against a server without WAIT = %v, want an error naming min_replicas and the refusal", err)
	}
	alone := testredis.Start(t)
	err = provisionErr(t, &Store{Addresses: []string{alone.Addr()}, MinReplicas: 1})
	if !errors.Is(err, errTooFewReplicas) || !strings.Contains(err.Error(), "the master has 0, min_replicas wants 1") {
		t.Errorf("Provision against a server without replicas = %v, want too few replicas", err)
	}
	// Without min_replicas, the same server is fine.
	storetest.Provision(t, &Store{Addresses: []string{alone.Addr()}})

	// Down at provisioning: Caddy starts, and the first claim says why it
	// fails once the server answers.
	alone.Kill()
	s := storetest.Provision(t, failFast(&Store{Addresses: []string{alone.Addr()}, MinReplicas: 1}))
	alone.Restart(t)
	k := storetest.NewKey()
	rec, err := acquireRecord(context.Background(), s, k, claim())
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "too few replicas: 0 of 1 acknowledged the claim") || rec != nil {
		t.Fatalf("the first claim on a server without replicas = %+v, %v; want too few replicas", rec, err)
	}
	if n, _ := alone.Client().Exists(context.Background(), s.key(k)).Result(); n != 0 {
		t.Error("the refused claim stayed")
	}
	noWait.Kill()
	s = storetest.Provision(t, failFast(&Store{Addresses: []string{noWait.Addr()}, MinReplicas: 1}))
	noWait.Restart(t)
	rec, err = acquireRecord(context.Background(), s, storetest.NewKey(), claim())
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "the server must accept WAIT") || rec != nil {
		t.Fatalf("the first claim on a server without WAIT = %+v, %v; want the refusal", rec, err)
	}
}

// openReplicated is a Sentinel-followed store with min_replicas 1.
func openReplicated(t testing.TB, sg *testredis.Sentinel, prefix string) *Store {
	t.Helper()
	sg.WaitReplicated(t) // the replica may still be syncing
	// A pipeline's WAIT is read within read_timeout: room for a loaded
	// machine.
	s := failFast(&Store{
		Addresses: sg.SentinelAddrs(), MasterName: sg.MasterName(), KeyPrefix: prefix,
		MinReplicas: 1, ReplicaTimeout: caddy.Duration(100 * time.Millisecond),
	})
	s.ReadTimeout = caddy.Duration(500 * time.Millisecond)
	return storetest.Provision(t, s)
}

func TestMinReplicasContract(t *testing.T) {
	sg := testredis.StartSentinel(t)
	storetest.Run(t, func(t *testing.T) store.Store { return openReplicated(t, sg, "test:"+t.Name()) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return openReplicated(t, sg, "test:"+t.Name()) })
}

// A claim that no replica acknowledged (the replication link blackholed)
// is withdrawn and the call fails as unavailable, within about
// replica_timeout; with the link back, claims succeed, and each is on the
// replica when Acquire returns.
func TestMinReplicasWithdrawsUnacknowledgedClaim(t *testing.T) {
	sg, link := testredis.StartSentinelBehindLink(t)
	s := openReplicated(t, sg, "withdraw")
	ctx := context.Background()
	master, replica := sg.Client(sg.InitialMasterAddr()), sg.Client(sg.InitialReplicaAddr())
	before := testutil.ToFloat64(s.replicas.shortClaims)

	link.Blackhole(true)
	k := storetest.NewKey()
	start := time.Now()
	rec, err := acquireRecord(ctx, s, k, claim())
	took := time.Since(start)
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, errTooFewReplicas) || rec != nil {
		t.Fatalf("Acquire with the replica cut off = %+v, %v; want ErrUnavailable (too few replicas)", rec, err)
	}
	if took < 100*time.Millisecond || took > 600*time.Millisecond {
		t.Errorf("the refused claim took %v, want about replica_timeout (100ms)", took)
	}
	if n, err := master.Exists(ctx, s.key(k)).Result(); err != nil || n != 0 {
		t.Errorf("the refused claim is still on the master: %d, %v; want it withdrawn", n, err)
	}
	if got := testutil.ToFloat64(s.replicas.shortClaims) - before; got != 1 {
		t.Errorf("claim shortfalls counted %v, want 1", got)
	}

	// The stream lost bytes in the blackhole: cut it, and the replica
	// reconnects and resyncs.
	link.Blackhole(false)
	link.Cut()
	var c *store.Claim
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		k, c = storetest.NewKey(), claim()
		if rec, err = acquireRecord(ctx, s, k, c); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || rec != nil {
		t.Fatalf("Acquire after the link came back = %+v, %v; want a claim", rec, err)
	}
	if n, err := replica.Exists(ctx, s.key(k)).Result(); err != nil || n != 1 {
		t.Fatalf("the acknowledged claim is not on the replica: %d, %v", n, err)
	}
	if err := s.Complete(ctx, k, c, testResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, err := replica.Get(ctx, s.key(k)).Bytes(); err != nil || store.Encoded(v).State() != store.Completed {
		t.Fatalf("the completion is not on the replica when Complete returns: %v", err)
	}
}

// A replica stopped with SIGSTOP answers nothing: new keys fail within
// about replica_timeout and leave no claim; replays need no replica and go
// on; a completion the replica missed is kept, counted, and reaches the
// replica once it is back; new claims succeed again after SIGCONT.
func TestMinReplicasPausedReplica(t *testing.T) {
	sg := testredis.StartSentinel(t)
	s := openReplicated(t, sg, "paused")
	ctx := context.Background()
	master, replica := sg.Client(sg.InitialMasterAddr()), sg.Client(sg.InitialReplicaAddr())

	done, inFlight := storetest.NewKey(), storetest.NewKey()
	cd, ci := mustClaimKey(t, s, done), mustClaimKey(t, s, inFlight)
	if err := s.Complete(ctx, done, cd, testResponse("before"), time.Minute); err != nil {
		t.Fatal(err)
	}
	completions := testutil.ToFloat64(s.replicas.shortCompletions)

	sg.Pause(t, sg.InitialReplicaAddr())
	for range 5 {
		k := storetest.NewKey()
		start := time.Now()
		rec, err := acquireRecord(ctx, s, k, claim())
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("a claim with the replica paused took %v, want about replica_timeout", took)
		}
		if !errors.Is(err, errTooFewReplicas) || rec != nil {
			t.Fatalf("Acquire with the replica paused = %+v, %v; want too few replicas", rec, err)
		}
		if n, _ := master.Exists(ctx, s.key(k)).Result(); n != 0 {
			t.Fatal("a refused claim stayed on the master")
		}
	}
	start := time.Now()
	wantStoredRecord(t, s, done, store.Completed, "before", store.Token{})
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("a replay with the replica paused took %v; replays must not wait", took)
	}
	if err := s.Complete(ctx, inFlight, ci, testResponse("during"), time.Minute); err != nil {
		t.Fatalf("Complete with the replica paused = %v, want the completion kept", err)
	}
	if got := testutil.ToFloat64(s.replicas.shortCompletions) - completions; got != 1 {
		t.Errorf("completion shortfalls counted %v, want 1", got)
	}
	wantStoredRecord(t, s, inFlight, store.Completed, "during", store.Token{})

	sg.Resume(t, sg.InitialReplicaAddr())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rec, err := acquireRecord(ctx, s, storetest.NewKey(), claim()); err == nil && rec == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no claim succeeded within 10s of SIGCONT: %v", err)
		}
	}
	// The master resent the completion; the replica has it.
	v, err := replica.Get(ctx, s.key(inFlight)).Bytes()
	if err != nil || store.Encoded(v).State() != store.Completed {
		t.Fatalf("the replica's copy of the completion made while it was paused: %v (%v); want completed", store.Encoded(v).State(), err)
	}
}

// The blackholed-link failover of TestSentinelUnreplicatedClaimIsLost,
// under traffic over many keys, with two stores on one Sentinel group:
// today's default (min_replicas 0) and min_replicas 1. Every claim either
// store acknowledged before the master died is looked up after the
// failover: one that is gone is a request that its retry runs a second
// time. The default loses the claims made while the link was cut; with
// min_replicas 1, those claims were refused (503) instead, and none is
// lost.
func TestMinReplicasFailoverLosesNoClaim(t *testing.T) {
	sg, link := testredis.StartSentinelBehindLink(t)
	stores := map[string]*Store{
		"min_replicas 0": openSentinel(t, sg, "failover"),
		"min_replicas 1": openReplicated(t, sg, "failover"),
	}
	ctx := context.Background()

	type claimed struct {
		key   store.Key
		token store.Token
		at    time.Time
	}
	var (
		mu      sync.Mutex
		claims  = map[string][]claimed{}
		refused = map[string]int{}
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for name, s := range stores {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					k, c := storetest.NewKey(), claim()
					rec, err := acquireRecord(ctx, s, k, c)
					mu.Lock()
					switch {
					case err == nil && rec == nil:
						claims[name] = append(claims[name], claimed{k, c.Token, time.Now()})
					case err != nil:
						refused[name]++
					}
					mu.Unlock()
					time.Sleep(time.Millisecond)
				}
			}()
		}
	}

	time.Sleep(500 * time.Millisecond)
	link.Blackhole(true)
	time.Sleep(500 * time.Millisecond)
	old := sg.KillMaster(t)
	killedAt := time.Now()
	sg.WaitFailover(t, old, testredis.FailoverWait)
	close(stop)
	wg.Wait()

	// Look every acknowledged claim up on the new master, through the
	// default store (its lookups need no replica).
	lookup := stores["min_replicas 0"]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := lookup.Acquire(ctx, storetest.NewKey(), claim()); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the store did not reach the new master: %v", err)
		}
	}
	lost := map[string]int{}
	for name, cs := range claims {
		for _, c := range cs {
			if c.at.After(killedAt) {
				continue
			}
			rec, err := acquireRecord(ctx, lookup, c.key, claim())
			if err != nil {
				t.Fatalf("looking a claim up after the failover: %v", err)
			}
			if rec == nil || rec.Token != c.token {
				lost[name]++
			}
		}
	}
	for _, name := range []string{"min_replicas 0", "min_replicas 1"} {
		t.Logf("%s: %d claims acknowledged before the kill, %d lost in the failover (each a second execution of its retry), %d calls refused",
			name, len(claims[name]), lost[name], refused[name])
	}
	if lost["min_replicas 0"] == 0 {
		t.Error("the default lost no claim: the link was not cut under traffic, and the test proves nothing")
	}
	if lost["min_replicas 1"] != 0 {
		t.Errorf("with min_replicas 1, %d acknowledged claims were lost in the failover", lost["min_replicas 1"])
	}
	if len(claims["min_replicas 1"]) == 0 {
		t.Error("min_replicas 1 made no claim at all")
	}
}

// On a Cluster with a replica per master, min_replicas 1 sends each WAIT to
// the key's own master: the contract passes, and every claim is on its
// master's replica when Acquire returns.
func TestMinReplicasCluster(t *testing.T) {
	c := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Replicas: true})
	open := func(t *testing.T, prefix string) *Store {
		return storetest.Provision(t, &Store{Addresses: c.Addrs(), KeyPrefix: prefix, MinReplicas: 1})
	}
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, "test:"+t.Name()) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return open(t, "test:"+t.Name()) })

	s := open(t, "cluster-replicas")
	ctx := context.Background()
	for i := range 3 {
		if err := c.Node(i).ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	perMaster := map[int]int{}
	for i := range 30 {
		k := storetest.NewKey()
		cl := mustClaimKey(t, s, k)
		master := c.SlotOwner(t, testredis.KeySlot(s.key(k)))
		perMaster[master]++
		replica := master + 3
		// A replica answers reads on a connection that asked READONLY.
		conn := c.Node(replica).Conn()
		_ = conn.ReadOnly(ctx).Err()
		n, err := conn.Exists(ctx, s.key(k)).Result()
		_ = conn.Close()
		if err != nil || n != 1 {
			t.Fatalf("claim %d: not on node %d, the replica of its master %d, when Acquire returned: %d, %v", i, replica, master, n, err)
		}
		if err := s.Complete(ctx, k, cl, testResponse(fmt.Sprint(i)), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Each key's claim and completion waited on its own master: two WAITs.
	for i := range 3 {
		if got, want := waitCalls(t, c.Node(i)), int64(2*perMaster[i]); got != want {
			t.Errorf("master %d ran WAIT %d times, want %d (twice for each of its %d keys)", i, got, want, perMaster[i])
		}
	}
}

// waitCalls is how many WAITs node ran since CONFIG RESETSTAT.
func waitCalls(t *testing.T, node *goredis.Client) int64 {
	t.Helper()
	info, err := node.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_wait:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// The cost of min_replicas 1, side by side with 0, on one master and its
// replica: a new key (the claim and the completion of a 1 KiB response,
// each followed by a WAIT) and a replay (no WAIT).
func BenchmarkMinReplicas(b *testing.B) {
	sg := testredis.StartSentinel(b)
	for _, n := range []int{0, 1} {
		var s *Store
		if n == 0 {
			s = openSentinel(b, sg, "bench")
		} else {
			s = openReplicated(b, sg, "bench")
		}
		resp := &store.Response{Status: 200, Body: []byte(strings.Repeat("x", 1024))}
		b.Run(fmt.Sprintf("new_key/min_replicas=%d", n), func(b *testing.B) {
			ctx, c := context.Background(), claim()
			b.ReportAllocs()
			for b.Loop() {
				k := storetest.NewKey()
				if _, err := s.Acquire(ctx, k, c); err != nil {
					b.Fatal(err)
				}
				if err := s.Complete(ctx, k, c, resp, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("replay/min_replicas=%d", n), func(b *testing.B) {
			storetest.BenchmarkReplay(b, s, resp)
		})
	}
}

// A completion made while the replication link is cut is kept on the
// master and resent; the master dies before the replica has it, and the
// promoted replica holds only the owner's claim. The resend stores the
// completion there, so the retry is replayed instead of waiting for the
// lease to pass and running again.
func TestMinReplicasCompletionResentAfterFailover(t *testing.T) {
	sg, link := testredis.StartSentinelBehindLink(t)
	s := openReplicated(t, sg, "resent")
	lookup := openSentinel(t, sg, "resent")
	ctx := context.Background()

	k := storetest.NewKey()
	c := mustClaimKey(t, s, k)
	link.Blackhole(true)
	if err := s.Complete(ctx, k, c, testResponse("kept"), time.Minute); err != nil {
		t.Fatalf("Complete with the link cut = %v, want the completion kept", err)
	}
	old := sg.KillMaster(t)
	killedAt := time.Now()
	sg.WaitFailover(t, old, testredis.FailoverWait)

	var rec *store.Record
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		rec, err = acquireRecord(ctx, lookup, k, claim())
		if err == nil && rec != nil && rec.State == store.Completed {
			break
		}
	}
	if err != nil || rec == nil || rec.State != store.Completed || string(rec.Body) != "kept" {
		t.Fatalf("the key on the new master = %+v, %v; want the completion resent", rec, err)
	}
	t.Logf("the completion reached the new master %v after the kill", time.Since(killedAt).Round(time.Millisecond))
}

// A completion the replicas missed is resent only while its claim's lease
// lasts. Past it the resend gives up, but the replicas' copy of the claim
// does not expire with its lease (keyLife): a failover that loses the
// completion brings it back, dead, and a retry is answered as for any dead
// owner: taken over and run again, or with on_unknown_outcome keep turned
// into its unknown outcome, never a key as new as if nothing had run.
func TestMinReplicasResendGivesUpWithTheLease(t *testing.T) {
	sg, link := testredis.StartSentinelBehindLink(t)
	s := openReplicated(t, sg, "gaveup")
	lookup := openSentinel(t, sg, "gaveup")
	ctx := context.Background()
	kept, rerun := storetest.NewKey(), storetest.NewKey()
	owners := map[store.Key]*store.Claim{}
	for _, k := range []store.Key{kept, rerun} {
		c := claim()
		c.Lease, c.TTL = time.Second, time.Hour
		if got, err := s.Acquire(ctx, k, c); err != nil || got.Record != nil {
			t.Fatalf("Acquire = %+v, %v; want a claim", got, err)
		}
		owners[k] = c
	}
	link.Blackhole(true)
	abandoned := testutil.ToFloat64(s.replicas.abandoned)
	for k, c := range owners {
		if err := s.Complete(ctx, k, c, testResponse("lost"), time.Minute); err != nil {
			t.Fatalf("Complete with the link cut = %v, want the completion kept", err)
		}
	}
	waitFor(t, "the resends to give up with the lease", func() bool {
		return testutil.ToFloat64(s.replicas.abandoned) == abandoned+2
	})
	old := sg.KillMaster(t)
	sg.WaitFailover(t, old, testredis.FailoverWait)

	acquire := func(k store.Key, c *store.Claim) store.Acquired {
		t.Helper()
		var got store.Acquired
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if got, err = lookup.Acquire(ctx, k, c); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("Acquire after the failover: %v", err)
		}
		return got
	}
	if got := acquire(kept, keepClaim()); got.Record == nil || !got.Record.OutcomeUnknown || !got.TookOver {
		t.Fatalf("a retry with keep after the failover = %+v; want the dead claim's unknown outcome", got)
	}
	if got := acquire(rerun, claim()); got.Record != nil || !got.TookOver {
		t.Fatalf("a retry without keep after the failover = %+v; want a takeover of the dead claim", got)
	}
	for k, c := range owners {
		if err := lookup.Complete(ctx, k, c, testResponse("again"), time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Errorf("the owner's Complete after the failover = %v, want ErrNotOwner", err)
		}
	}
}

// A master that lost its scripts (SCRIPT FLUSH here; a restarted or newly
// promoted master alike) answers the pipelined EVALSHA with NOSCRIPT: the
// completion is sent again with EVAL, and its WAIT with it.
func TestMinReplicasCompleteAfterScriptFlush(t *testing.T) {
	sg := testredis.StartSentinel(t)
	s := openReplicated(t, sg, "noscript")
	ctx := context.Background()
	master, replica := sg.Client(sg.InitialMasterAddr()), sg.Client(sg.InitialReplicaAddr())
	for i := range 2 {
		if err := master.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		k := storetest.NewKey()
		c := mustClaimKey(t, s, k)
		if err := s.Complete(ctx, k, c, testResponse(fmt.Sprint(i)), time.Minute); err != nil {
			t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
		}
		if v, err := replica.Get(ctx, s.key(k)).Bytes(); err != nil || store.Encoded(v).State() != store.Completed {
			t.Fatalf("the completion is not on the replica when Complete returns: %v", err)
		}
	}
}

// A replay writes nothing and waits for no replica, so with min_replicas it
// costs what it costs without: no connection of its own, no more allocations.
func TestMinReplicasReplayCostsNoMore(t *testing.T) {
	sg := testredis.StartSentinel(t)
	plain, replicated := openSentinel(t, sg, "replaycost"), openReplicated(t, sg, "replaycost")
	ctx := context.Background()
	k := storetest.NewKey()
	c := mustClaimKey(t, replicated, k)
	if err := replicated.Complete(ctx, k, c, testResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	retry := claim()
	allocs := func(s *Store) float64 {
		return testing.AllocsPerRun(500, func() {
			if rec, err := acquireRecord(ctx, s, k, retry); err != nil || rec == nil {
				t.Fatalf("replay = %+v, %v", rec, err)
			}
		})
	}
	without, with := allocs(plain), allocs(replicated)
	t.Logf("allocations per replay: %v with min_replicas 0, %v with 1", without, with)
	if with > without+1 {
		t.Errorf("a replay with min_replicas 1 makes %v allocations, %v without: it must cost no more", with, without)
	}
}

// A replay with min_replicas 1, as BenchmarkReplay measures one without.
func BenchmarkReplayMinReplicas(b *testing.B) {
	benchmarkReplay(b, openReplicated(b, testredis.StartSentinel(b), "bench"))
}
