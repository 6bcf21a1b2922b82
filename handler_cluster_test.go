package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// clusterStoreJSON is the JSON of a redis store on the cluster's nodes;
// several addresses select Cluster mode. timeout, if set, is the dial,
// read and write timeout; poolSize, if set, the connections per node.
func clusterStoreJSON(cl *testredis.Cluster, timeout time.Duration, poolSize int) json.RawMessage {
	addrs, _ := json.Marshal(cl.Addrs())
	raw := `{"module":"redis","addresses":` + string(addrs)
	if timeout > 0 {
		d := strconv.Quote(timeout.String())
		raw += `,"dial_timeout":` + d + `,"read_timeout":` + d + `,"write_timeout":` + d
	}
	if poolSize > 0 {
		raw += `,"pool_size":` + strconv.Itoa(poolSize)
	}
	return json.RawMessage(raw + `}`)
}

// timedResult is a response and how long the handler took to answer it.
type timedResult struct {
	response
	took time.Duration
}

// clusterBurst sends n concurrent copies of a request, built by req, through h.
func clusterBurst(h *Handler, b *backend, n int, req func() response) []timedResult {
	out := make([]timedResult, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			r := req()
			out[i] = timedResult{r, time.Since(t0)}
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// wantBurstRefused checks the answer of one request of a burst of one key
// while the store times out: 503, its own claim failed, or 409, another
// claim of the key was under way in this process past inFlightWait.
func wantBurstRefused(t *testing.T, r response) {
	t.Helper()
	if r.Code == http.StatusConflict {
		wantProblem(t, r, 409, "A request is outstanding for this Idempotency-Key")
		return
	}
	wantProblem(t, r, 503, "Idempotency store unavailable")
}

// tallyStatuses tallies the statuses of rs and their slowest answer.
func tallyStatuses(rs []timedResult) (map[int]int, time.Duration) {
	counts := make(map[int]int)
	var slowest time.Duration
	for _, r := range rs {
		counts[r.Code]++
		slowest = max(slowest, r.took)
	}
	return counts, slowest
}

// The handler's core behaviour on a 3-master Redis Cluster.
func TestClusterHandler(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	raw := clusterStoreJSON(cl, 0, 0)

	t.Run("FirstRunsRetryReplays", func(t *testing.T) {
		h := provision(t, raw, nil)
		b := &backend{}
		first := do(h, b, post("/orders", "cluster-k1", `{"sku":"tea"}`))
		wantStatus(t, first, 201)
		if first.placeholder("http.idempotency.result") != "new" {
			t.Fatalf("result %q, want new", first.placeholder("http.idempotency.result"))
		}
		for range 3 {
			r := do(h, b, post("/orders", "cluster-k1", `{"sku":"tea"}`))
			wantStatus(t, r, 201)
			if r.Body.String() != first.Body.String() || r.Header().Get("Idempotent-Replayed") != "true" ||
				r.Header().Get("X-Order") != "42" || r.Header().Get("Set-Cookie") != "" {
				t.Fatalf("replay %v %q, want the stored response", r.Header(), r.Body)
			}
		}
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})

	t.Run("KeyBoundToEndpointAndPayload", func(t *testing.T) {
		h := provision(t, raw, nil)
		b := &backend{}
		wantStatus(t, do(h, b, post("/orders", "cluster-k2", `{"amount":100}`)), 201)
		wantProblem(t, do(h, b, post("/refunds", "cluster-k2", `{"amount":100}`)), 422, "Idempotency-Key is already used")
		wantProblem(t, do(h, b, post("/orders", "cluster-k2", `{"amount":200}`)), 422, "Idempotency-Key is already used")
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})

	t.Run("ConcurrentDuplicatesRunOnce", func(t *testing.T) {
		h := provision(t, raw, nil)
		b := &backend{blockers: make(chan struct{})}
		const n = 50
		var finished atomic.Int64
		done := make(chan []timedResult)
		go func() {
			done <- clusterBurst(h, b, n, func() response {
				defer finished.Add(1)
				return do(h, b, post("/orders", "cluster-dup", `{"x":1}`))
			})
		}()
		// Every duplicate is answered while the owner is still blocked.
		waitFor(t, func() bool { return finished.Load() == n-1 })
		if b.runs.Load() != 1 {
			t.Fatalf("backend ran %d times while the owner was blocked", b.runs.Load())
		}
		close(b.blockers)
		counts, _ := tallyStatuses(<-done)
		if counts[201] != 1 || counts[409] != n-1 || b.runs.Load() != 1 {
			t.Fatalf("statuses %v, %d runs; want one 201, %d 409 and one run", counts, b.runs.Load(), n-1)
		}
		r := do(h, b, post("/orders", "cluster-dup", `{"x":1}`))
		if wantStatus(t, r, 201); r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
			t.Fatal("the retry after completion was not a replay")
		}
	})

	// Many keys, spread over every master, each with duplicates: each key
	// runs once.
	t.Run("ManyKeysAcrossMasters", func(t *testing.T) {
		h := provision(t, raw, nil)
		const keys, dups = 30, 5
		runs := make(map[string]int)
		var mu sync.Mutex
		b := &backend{}
		b.serve = func(w http.ResponseWriter, r *http.Request) error {
			mu.Lock()
			runs[r.Header.Get("Idempotency-Key")]++
			mu.Unlock()
			w.WriteHeader(201)
			return nil
		}
		masters := make(map[int]bool)
		var hashes sync.Map
		var wg sync.WaitGroup
		for i := range keys * dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("cluster-many-%d", i%keys)
				r := do(h, b, post("/orders", key, "x"))
				if r.Code != 201 && r.Code != 409 {
					t.Errorf("key %s: status %d", key, r.Code)
				}
				hashes.Store(key, r.placeholder("http.idempotency.key"))
			}()
		}
		wg.Wait()
		hashes.Range(func(_, v any) bool {
			masters[cl.SlotOwner(t, testredis.KeySlot("idempotency:{"+v.(string)+"}"))] = true
			return true
		})
		for i := range keys {
			key := fmt.Sprintf("cluster-many-%d", i)
			if runs[key] != 1 {
				t.Errorf("key %s ran %d times, want 1", key, runs[key])
			}
			// Every key replays now.
			r := do(h, b, post("/orders", key, "x"))
			if r.Code != 201 || r.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("key %s: retry %d %v, want a replay", key, r.Code, r.Header())
			}
		}
		if len(masters) != 3 {
			t.Fatalf("%d keys landed on %d masters, want all 3", keys, len(masters))
		}
	})
}

// Redis is slow: a faultproxy in front of every cluster node delays the
// store's traffic past read_timeout. Every request is answered within a
// bound (503 with fail_closed: nothing ran), and no key runs twice.
//
// The bound is not read_timeout. In Cluster mode go-redis runs a command up
// to MaxRedirects+1 (4) times, with a backoff of up to 512ms between, and
// each of those runs is retried once more (MaxRetries 1), every try with
// its own dial and read timeouts: about 8 x (dial + read) + 1.5s in the
// worst case, 4.7s with 200ms timeouts. Measured: one request alone takes
// about 1.26s (0.45s on a single node); under a 50-request burst on a busy
// 2-CPU machine, up to 4.4s. When the burst outnumbers the pool, the waits
// for a connection (PoolTimeout, read_timeout + 1s, per try) add more: up
// to 5s with the default pool of 10 per CPU, so the pool here is larger
// than the burst. A deadline per store call would bound all of it (see the
// report).
func TestClusterHandlerSlowStore(t *testing.T) {
	cl := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Proxied: true})
	const timeout = 200 * time.Millisecond
	raw := clusterStoreJSON(cl, timeout, 64)
	setLatency := func(d time.Duration) {
		for _, p := range cl.Proxies() {
			p.SetLatency(d)
		}
	}
	const bound = 6 * time.Second
	checkBound := func(t *testing.T, what string, rs []timedResult) {
		t.Helper()
		counts, slowest := tallyStatuses(rs)
		for _, r := range rs {
			if r.took > bound {
				t.Errorf("%s: a request took %v, want under %v", what, r.took, bound)
			}
		}
		t.Logf("%s: statuses %v, slowest answer %v", what, counts, slowest.Round(time.Millisecond))
	}
	short := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	long := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(5 * time.Second) })
	// The expected store errors go to recorders instead of the test output.
	shortLogs, longLogs := watchLogs(short), watchLogs(long)
	defer func() {
		t.Logf("logged: %d entries (lock_timeout 1s), %d (lock_timeout 5s)", shortLogs.Len(), longLogs.Len())
	}()

	// Warm every master's connection pool.
	warm := &backend{}
	for i := range 30 {
		wantStatus(t, do(short, warm, post("/warm", "warm-"+strconv.Itoa(i), "x")), 201)
	}

	t.Run("AllCallsTimeOut", func(t *testing.T) {
		b := &backend{}
		setLatency(300 * time.Millisecond) // 600ms round trips, read_timeout 200ms
		rs := clusterBurst(short, b, 50, func() response { return do(short, b, post("/pay", "slow-a", `{"n":1}`)) })
		setLatency(0)
		checkBound(t, "300ms latency", rs)
		for _, r := range rs {
			wantBurstRefused(t, r.response)
		}
		if n := b.runs.Load(); n != 0 {
			t.Fatalf("backend ran %d times while the store timedResult out, want 0 (fail_closed)", n)
		}

		// A timedResult-out claim may have reached Redis: the key is then held
		// until its lease (lock_timeout 1s) passes, and one retry runs.
		start := time.Now()
		var conflicts int
		for {
			r := do(short, b, post("/pay", "slow-a", `{"n":1}`))
			if r.Code == 201 {
				break
			}
			if r.Code != 409 {
				t.Fatalf("retry after the store healed: %d %s", r.Code, r.Body)
			}
			conflicts++
			if time.Since(start) > 3*time.Second {
				t.Fatal("the key stayed blocked for more than 3s (lock_timeout 1s)")
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("after healing: %d conflicts over %v, then one run", conflicts, time.Since(start).Round(time.Millisecond))
		r := do(short, b, post("/pay", "slow-a", `{"n":1}`))
		if r.Code != 201 || r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
			t.Fatalf("retry: %d %v, %d runs; want a replay and one run", r.Code, r.Header(), b.runs.Load())
		}
	})

	t.Run("TimeoutsWhileTheOwnerRuns", func(t *testing.T) {
		b := &backend{blockers: make(chan struct{})}
		owner := make(chan response)
		go func() { owner <- do(long, b, post("/pay", "slow-c", "x")) }()
		waitFor(t, func() bool { return b.runs.Load() == 1 })
		rs := clusterBurst(long, b, 20, func() response { return do(long, b, post("/pay", "slow-c", "x")) })
		for _, r := range rs {
			wantStatus(t, r.response, 409)
		}
		setLatency(300 * time.Millisecond)
		rs = clusterBurst(long, b, 50, func() response { return do(long, b, post("/pay", "slow-c", "x")) })
		setLatency(0)
		checkBound(t, "300ms latency while the owner runs", rs)
		for _, r := range rs {
			wantBurstRefused(t, r.response)
		}
		close(b.blockers)
		wantStatus(t, <-owner, 201)
		r := do(long, b, post("/pay", "slow-c", "x"))
		if r.Code != 201 || r.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
			t.Fatalf("retry: %d %v, %d runs; want a replay and one run", r.Code, r.Header(), b.runs.Load())
		}
	})

	// Round trips close to read_timeout: some store calls make it, some
	// do not. Whatever each request got, the key ran at most once.
	t.Run("BorderlineLatency", func(t *testing.T) {
		for round := range 3 {
			b := &backend{}
			key := "slow-d-" + strconv.Itoa(round)
			setLatency(timeout/2 - 10*time.Millisecond) // round trips just under read_timeout
			rs := clusterBurst(long, b, 50, func() response { return do(long, b, post("/pay", key, "x")) })
			setLatency(0)
			checkBound(t, "borderline latency", rs)
			var ran int64
			for _, r := range rs {
				switch {
				case r.Code == 201 && r.Header().Get("Idempotent-Replayed") == "":
					ran++
				case r.Code == 201, r.Code == 409, r.Code == 503:
				default:
					t.Fatalf("unexpected status %d: %s", r.Code, r.Body)
				}
			}
			if n := b.runs.Load(); n > 1 || ran != n {
				t.Fatalf("backend ran %d times, %d requests answered as the first; want at most one, the same", n, ran)
			}
		}
	})
}
