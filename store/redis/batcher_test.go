package redis

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// tripHook counts what the client sends for the store's calls: the
// commands, the round trips (one per command sent alone, one per
// pipeline), the commands pipelines carried and the longest pipeline. A
// new connection's handshake (HELLO, CLIENT SETINFO) is not a store call.
type tripHook struct{ sent, trips, pipelined, longest atomic.Int64 }

func handshake(cmd goredis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select", "ping":
		return true
	}
	return false
}

func (h *tripHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *tripHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !handshake(cmd) {
			h.sent.Add(1)
			h.trips.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *tripHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if !handshake(cmds[0]) {
			n := int64(len(cmds))
			h.sent.Add(n)
			h.trips.Add(1)
			h.pipelined.Add(n)
			raise(&h.longest, n)
		}
		return next(ctx, cmds)
	}
}

// raise sets a to n if n is larger.
func raise(a *atomic.Int64, n int64) {
	for m := a.Load(); n > m && !a.CompareAndSwap(m, n); m = a.Load() {
	}
}

// check is one store call of a burst and what it must answer.
type check struct {
	name string
	call func(ctx context.Context) error // nil when the answer is right
}

// burst starts opener, then, while its round trip is still on the slow
// link, every check at once; it fails the test for each wrong answer.
func burst(t *testing.T, opener func(), checks []check) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(opener)
	time.Sleep(5 * time.Millisecond) // the opener is on the wire now
	errs := make([]error, len(checks))
	for i, c := range checks {
		wg.Go(func() { errs[i] = c.call(context.Background()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", checks[i].name, err)
		}
	}
}

func wantReplay(s *Store, k store.Key, body string) func(context.Context) error {
	return func(ctx context.Context) error {
		rec, err := acquireRecord(ctx, s, k, claim())
		if err != nil || rec == nil || rec.State != store.Completed || string(rec.Body) != body {
			return fmt.Errorf("Acquire = %+v, %v; want the record with body %q", rec, err, body)
		}
		return nil
	}
}

func wantClaim(s *Store, k store.Key) func(context.Context) error {
	return func(ctx context.Context) error {
		if rec, err := acquireRecord(ctx, s, k, claim()); rec != nil || err != nil {
			return fmt.Errorf("Acquire = %+v, %v; want a claim", rec, err)
		}
		return nil
	}
}

func wantComplete(s *Store, k store.Key, c *store.Claim, body string) func(context.Context) error {
	return func(ctx context.Context) error { return s.Complete(ctx, k, c, testResponse(body), time.Minute) }
}

// Calls made while one is on the wire go out together, one round trip for
// all, and each gets its own answer: a replay its own record, a conflict
// the claim it met, an error its own error, and nobody another's.
func TestPipelinedCallsShareRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		pipelining bool
		maxTrips   int64
	}{{true, 2}, {false, 0}} {
		t.Run(fmt.Sprintf("pipelining=%t", tc.pipelining), func(t *testing.T) {
			srv := testredis.Start(t)
			p := faultproxy.Start(t, srv.Addr())
			s := storetest.Provision(t, &Store{Addresses: []string{p.Addr()}, KeyPrefix: "batch", Pipelining: &tc.pipelining})
			ctx := context.Background()
			hook := &tripHook{}
			s.client.AddHook(hook)

			var checks []check
			for i := range 4 {
				k := storetest.NewKey()
				c := mustClaimKey(t, s, k)
				if err := s.Complete(ctx, k, c, testResponse(fmt.Sprint("replay-", i)), time.Minute); err != nil {
					t.Fatal(err)
				}
				checks = append(checks, check{fmt.Sprint("replay ", i), wantReplay(s, k, fmt.Sprint("replay-", i))})
			}
			for i := range 4 {
				checks = append(checks, check{fmt.Sprint("new key ", i), wantClaim(s, storetest.NewKey())})
			}
			for i := range 4 {
				k := storetest.NewKey()
				checks = append(checks, check{fmt.Sprint("completion ", i), wantComplete(s, k, mustClaimKey(t, s, k), fmt.Sprint("done-", i))})
			}
			held := storetest.NewKey()
			holder := mustClaimKey(t, s, held)
			_ = s.Release(ctx, held, storetest.NewToken()) // loads the script: no NOSCRIPT below
			checks = append(checks, check{"conflict", func(ctx context.Context) error {
				rec, err := acquireRecord(ctx, s, held, claim())
				if err != nil || rec == nil || rec.State != store.InProgress || rec.Token != holder.Token {
					return fmt.Errorf("Acquire = %+v, %v; want the holder's claim", rec, err)
				}
				return nil
			}})
			checks = append(checks, check{"stranger's release", func(ctx context.Context) error {
				if err := s.Release(ctx, held, storetest.NewToken()); !errors.Is(err, store.ErrNotOwner) {
					return fmt.Errorf("Release = %v, want ErrNotOwner", err)
				}
				return nil
			}})
			// A key that is not a record: Redis answers WRONGTYPE to this
			// command alone.
			wrong := storetest.NewKey()
			if err := srv.Client().LPush(ctx, s.key(wrong), "x").Err(); err != nil {
				t.Fatal(err)
			}
			checks = append(checks, check{"wrong type", func(ctx context.Context) error {
				if _, err := s.Acquire(ctx, wrong, claim()); !errors.Is(err, store.ErrUnavailable) {
					return fmt.Errorf("Acquire of a list = %v, want ErrUnavailable", err)
				}
				return nil
			}})

			p.SetLatency(25 * time.Millisecond)
			before := hook.trips.Load()
			burst(t, func() {
				if err := wantClaim(s, storetest.NewKey())(ctx); err != nil {
					t.Errorf("opener: %v", err)
				}
			}, checks)
			trips, calls := hook.trips.Load()-before, int64(len(checks)+1)
			t.Logf("%d calls in %d round trips", calls, trips)
			if tc.pipelining && trips > tc.maxTrips {
				t.Errorf("%d calls took %d round trips, want at most %d", calls, trips, tc.maxTrips)
			}
			if !tc.pipelining && (trips != calls || hook.pipelined.Load() != 0) {
				t.Errorf("without pipelining, %d calls took %d round trips (%d pipelined), want one each", calls, trips, hook.pipelined.Load())
			}
		})
	}
}

// A caller that leaves while its call is queued withdraws it: the call is
// never sent (the handler answers 499 and runs nothing), and the other
// calls of the batch are answered as if it had not been there.
func TestPipelinedCallerLeaving(t *testing.T) {
	srv := testredis.Start(t)
	p := faultproxy.Start(t, srv.Addr())
	s := storetest.Provision(t, &Store{Addresses: []string{p.Addr()}, KeyPrefix: "leave"})
	mustClaimKey(t, s, storetest.NewKey()) // a pooled connection

	p.SetLatency(25 * time.Millisecond)
	left, cancel := context.WithCancel(context.Background())
	var checks []check
	for i := range 8 {
		checks = append(checks, check{fmt.Sprint("new key ", i), wantClaim(s, storetest.NewKey())})
	}
	withdrawn := storetest.NewKey()
	checks = append(checks, check{"leaving caller", func(context.Context) error {
		if _, err := s.Acquire(left, withdrawn, claim()); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("Acquire of a caller that left while queued = %v, want context.Canceled", err)
		}
		return nil
	}})
	time.AfterFunc(20*time.Millisecond, cancel) // while the batch waits behind the opener
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(context.Background()) }, checks)

	p.SetLatency(0)
	if n, err := srv.Client().Exists(context.Background(), s.key(withdrawn)).Result(); err != nil || n != 0 {
		t.Fatalf("the withdrawn claim is in Redis (%d, %v): it was sent", n, err)
	}
}

// On a Cluster, a batch is split per node, and a command of it that meets
// ASK (a slot migrating) or MOVED (a stale slot map) is redirected alone,
// as go-redis redirects a pipeline's commands: every answer is still the
// call's own.
func TestClusterPipelinedRedirects(t *testing.T) {
	cl := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Proxied: true})
	s := openCluster(t, cl, "batch")
	hook := &tripHook{}
	s.client.AddHook(hook)
	ctx := context.Background()

	moving := storetest.NewKey()
	slot := testredis.KeySlot(s.key(moving))
	from := cl.SlotOwner(t, slot)
	to := (from + 1) % 3
	held := mustClaimKey(t, s, moving)
	done := keyInSlot(t, s, slot)
	if err := s.Complete(ctx, done, mustClaimKey(t, s, done), testResponse("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	elsewhere := make([]store.Key, 4)
	for i := range elsewhere {
		elsewhere[i] = keyInSlot(t, s, (slot+1+i*5000)%16384)
	}

	cl.BeginMigration(t, slot, from, to)
	cl.MoveKeys(t, from, to, s.key(moving), s.key(done))
	setLatency := func(d time.Duration) {
		for _, p := range cl.Proxies() {
			p.SetLatency(d)
		}
	}
	setLatency(20 * time.Millisecond)
	fresh := []store.Key{keyInSlot(t, s, slot), keyInSlot(t, s, slot)}
	checks := []check{
		{"replay through ASK", wantReplay(s, done, "done")},
		{"completion through ASK", wantComplete(s, moving, held, "moved")},
		{"new key through ASK", wantClaim(s, fresh[0])},
		{"new key through ASK", wantClaim(s, fresh[1])},
	}
	for i, k := range elsewhere {
		checks = append(checks, check{fmt.Sprint("new key on another node ", i), wantClaim(s, k)})
	}
	before := hook.pipelined.Load()
	t.Cleanup(func() { setLatency(0) })
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(ctx) }, checks)

	setLatency(0)
	cl.FinishMigration(t, slot, from, to)
	setLatency(20 * time.Millisecond)
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(ctx) }, []check{
		{"replay through MOVED", wantReplay(s, done, "done")},
		{"replay through MOVED", wantReplay(s, moving, "moved")},
		{"new key through MOVED", wantClaim(s, keyInSlot(t, s, slot))},
		{"conflict through MOVED", func(ctx context.Context) error {
			rec, err := acquireRecord(ctx, s, fresh[0], claim())
			if err != nil || rec == nil || rec.State != store.InProgress {
				return fmt.Errorf("Acquire = %+v, %v; want the claim made during the migration", rec, err)
			}
			return nil
		}},
	})
	if n := hook.pipelined.Load() - before; n < 4 {
		t.Errorf("%d commands went out in pipelines, want the bursts batched", n)
	}
	if n, err := cl.Node(to).DBSize(ctx).Result(); err != nil || n < 5 {
		t.Errorf("the target holds %d keys (%v), want the migrated slot's", n, err)
	}
}

// Pipelining is on unless turned off.
func TestPipeliningOption(t *testing.T) {
	srv := testredis.Start(t)
	off := false
	for _, tc := range []struct {
		s    *Store
		want bool
	}{{&Store{}, true}, {&Store{Pipelining: &off}, false}} {
		tc.s.Addresses = []string{srv.Addr()}
		tc.s.DialTimeout = caddy.Duration(time.Second)
		s := storetest.Provision(t, tc.s)
		if _, batched := s.calls.(*batcher); batched != tc.want {
			t.Errorf("pipelining %v: calls go through %T", tc.s.Pipelining, s.calls)
		}
	}
}

// On a Cluster, a node that does not answer delays only the calls for
// its own slots: the calls for the other masters go on their own wires.
func TestClusterPipelinedLanes(t *testing.T) {
	cl := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Proxied: true})
	s := openCluster(t, cl, "lanes")
	ctx := context.Background()
	stuck := storetest.NewKey()
	dead := cl.SlotOwner(t, testredis.KeySlot(s.key(stuck)))
	var others []store.Key
	for len(others) < 6 {
		k := storetest.NewKey()
		if cl.SlotOwner(t, testredis.KeySlot(s.key(k))) != dead {
			others = append(others, k)
		}
	}
	mustClaimKey(t, s, storetest.NewKey()) // the slot map is loaded

	cl.Proxy(dead).Blackhole(true)
	defer cl.Proxy(dead).Blackhole(false)
	var checks []check
	for i, k := range others {
		checks = append(checks, check{fmt.Sprint("key on a live master ", i), func(ctx context.Context) error {
			start := time.Now()
			if err := wantClaim(s, k)(ctx); err != nil {
				return err
			}
			if took := time.Since(start); took > 150*time.Millisecond {
				return fmt.Errorf("took %v behind a node that does not answer", took)
			}
			return nil
		}})
	}
	burst(t, func() {
		if _, err := s.Acquire(ctx, stuck, claim()); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Acquire on the dead node = %v, want ErrUnavailable", err)
		}
	}, checks)
}

// BenchmarkConcurrentNewKeys runs 32 callers that each claim and complete
// new keys, with pipelining on and off, and reports per key what the
// caller's process and the Redis server spent (Redis's used_cpu), and the
// latency of a claim and completion:
//
//	go test -run '^$' -bench ConcurrentNewKeys -benchtime 20000x ./store/redis/
func BenchmarkConcurrentNewKeys(b *testing.B) {
	srv := testredis.Start(b)
	for _, callers := range []int{1, 32} {
		for _, on := range []bool{true, false} {
			b.Run(fmt.Sprintf("callers=%d/pipelining=%t", callers, on), func(b *testing.B) {
				s := storetest.Provision(b, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "bench", Pipelining: &on})
				ctx := context.Background()
				var next atomic.Int64
				redis0, self0 := redisCPU(b, srv), selfCPU()
				b.ResetTimer()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							k, c := storetest.NewKey(), claim()
							if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
								b.Error(rec, err)
								return
							}
							if err := s.Complete(ctx, k, c, testResponse("ok"), time.Minute); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				n := float64(b.N)
				b.ReportMetric((selfCPU()-self0).Seconds()*1e6/n, "caller-µs/key")
				b.ReportMetric((redisCPU(b, srv)-redis0).Seconds()*1e6/n, "redis-µs/key")
				b.ReportMetric(float64(b.Elapsed().Microseconds())*float64(callers)/n, "µs/key-latency")
			})
		}
	}
}

// redisCPU is the CPU time the server has used (INFO cpu).
func redisCPU(tb testing.TB, srv *testredis.Server) time.Duration {
	var sum float64
	for _, field := range []string{"used_cpu_sys", "used_cpu_user"} {
		v := infoField(tb, srv, "cpu", field)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("%s %q: %v", field, v, err)
		}
		sum += f
	}
	return time.Duration(sum * float64(time.Second))
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// panicHook panics in the commands it is told to.
type panicHook struct{ on atomic.Bool }

func (h *panicHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *panicHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if h.on.Load() && !handshake(cmd) {
			panic("hook")
		}
		return next(ctx, cmd)
	}
}

func (h *panicHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// A call that panics on the wire (a hook's bug) leaves the wire free:
// the calls after it are not stuck behind it.
func TestPipelinedPanicFreesTheLane(t *testing.T) {
	s := open(t, testredis.Start(t))
	hook := &panicHook{}
	s.client.AddHook(hook)
	hook.on.Store(true)
	func() {
		defer func() { _ = recover() }()
		_, _ = s.Acquire(context.Background(), storetest.NewKey(), claim())
		t.Fatal("the hook did not panic")
	}()
	hook.on.Store(false)
	done := make(chan error, 1)
	go func() { done <- wantClaim(s, storetest.NewKey())(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call after a panic on the wire is stuck")
	}
}

// A burst of large records goes out in several batches, none much over
// maxBatchBytes, so that no batch needs longer than write_timeout; and a
// burst of many calls in batches of maxBatchCalls, so that their replies,
// which may be whole records, are read within read_timeout.
func TestPipelinedBatchesAreBounded(t *testing.T) {
	hook := &tripHook{}
	s, p := proxiedStore(t, "bounded", hook)
	body := strings.Repeat("x", 100<<10)
	var checks []check
	for i := range 8 {
		k := storetest.NewKey()
		c := mustClaimKey(t, s, k)
		checks = append(checks, check{fmt.Sprint("large completion ", i), wantComplete(s, k, c, body)})
	}
	p.SetLatency(25 * time.Millisecond)
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(context.Background()) }, checks)
	if n := hook.longest.Load(); n > maxBatchBytes/(100<<10) || n < 2 {
		t.Errorf("the longest batch of 100 KiB completions had %d, want 2 (maxBatchBytes %d)", n, maxBatchBytes)
	}

	checks = nil
	for i := range 3 * maxBatchCalls {
		checks = append(checks, check{fmt.Sprint("new key ", i), wantClaim(s, storetest.NewKey())})
	}
	hook.longest.Store(0)
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(context.Background()) }, checks)
	if n := hook.longest.Load(); n != maxBatchCalls {
		t.Errorf("the longest batch of %d new keys had %d, want maxBatchCalls, %d", len(checks), n, maxBatchCalls)
	}
}

// overlapHook counts the store's pipelines on the wire at once, and the
// most; a new connection's handshake is not one.
type overlapHook struct{ now, most atomic.Int64 }

func (h *overlapHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *overlapHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (h *overlapHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if handshake(cmds[0]) {
			return next(ctx, cmds)
		}
		raise(&h.most, h.now.Add(1))
		defer h.now.Add(-1)
		return next(ctx, cmds)
	}
}

// A queue that fills a batch goes at once, on a connection of its own,
// instead of waiting for the call on the wire: one wire would cap a node
// at maxBatchCalls calls a round trip, however many callers wait.
func TestPipelinedFullBatchesDoNotWait(t *testing.T) {
	hook := &overlapHook{}
	s, p := proxiedStore(t, "full", hook)
	var checks []check
	for i := range 3 * maxBatchCalls {
		checks = append(checks, check{fmt.Sprint("new key ", i), wantClaim(s, storetest.NewKey())})
	}
	p.SetLatency(25 * time.Millisecond)
	burst(t, func() { _ = wantClaim(s, storetest.NewKey())(context.Background()) }, checks)
	t.Logf("%d calls behind one on the wire: %d batches on the wire at once", len(checks), hook.most.Load())
	if n := hook.most.Load(); n < 2 {
		t.Errorf("%d calls queued behind one on the wire went %d batch at a time, want their full batches at once", len(checks), n)
	}
}

// proxiedStore is a store on a private Redis behind a fault proxy, with
// hook on its client.
func proxiedStore(t *testing.T, prefix string, hook goredis.Hook) (*Store, *faultproxy.Proxy) {
	srv := testredis.Start(t)
	p := faultproxy.Start(t, srv.Addr())
	s := storetest.Provision(t, &Store{Addresses: []string{p.Addr()}, KeyPrefix: prefix})
	s.client.AddHook(hook)
	return s, p
}

// laneCount is how many masters b keeps a lane for.
func laneCount(b *batcher) int {
	n := 0
	b.lanes.Range(func(_, _ any) bool { n++; return true })
	return n
}

// reshardAll moves every slot of node from, and its keys, to node to, as
// an operator empties a node before removing it (redis-cli --cluster
// reshard), and waits until the cluster agrees.
func reshardAll(t *testing.T, cl *testredis.Cluster, from, to int) {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found (install redis-tools): %v", err)
	}
	ranges, err := cl.Node(to).ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].ID == cl.ID(from) {
			n += r.End - r.Start + 1
		}
	}
	out, err := exec.Command(cli, "--cluster", "reshard", cl.NodeAddr(to), "--cluster-from", cl.ID(from),
		"--cluster-to", cl.ID(to), "--cluster-slots", strconv.Itoa(n), "--cluster-yes").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	cl.WaitOK(t)
}

// A master that serves no slot any more (resharded away, then removed or
// replaced) loses its lane: a long-running Caddy does not keep a lane for
// every master it ever saw.
func TestClusterLanesOfMastersThatLeft(t *testing.T) {
	defer func(d time.Duration) { lanePruneInterval = d }(lanePruneInterval)
	lanePruneInterval = 100 * time.Millisecond
	cl := testredis.StartCluster(t, 3)
	s := openCluster(t, cl, "lanes-left")
	b := s.calls.(*batcher)
	keys := make(map[int]store.Key)
	claims := make(map[int]*store.Claim)
	for len(keys) < 3 {
		k := storetest.NewKey()
		if owner := cl.SlotOwner(t, testredis.KeySlot(s.key(k))); keys[owner] == (store.Key{}) {
			keys[owner], claims[owner] = k, mustClaimKey(t, s, k)
		}
	}
	if n := laneCount(b); n != 3 {
		t.Fatalf("%d lanes after a call on each of 3 masters, want 3", n)
	}

	start := time.Now()
	reshardAll(t, cl, 2, 0)
	t.Logf("resharding node 2's slots to node 0 took %v", time.Since(start).Round(time.Millisecond))
	for deadline := time.Now().Add(10 * time.Second); laneCount(b) != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes 10s after node 2 left the slot map, want 2", laneCount(b))
		}
	}
	// The key that was on node 2 answers from node 0, on node 0's lane.
	wantStoredRecord(t, s, keys[2], store.InProgress, "", claims[2].Token)
	if n := laneCount(b); n != 2 {
		t.Fatalf("%d lanes after a call on a moved key, want 2", n)
	}
}
