package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// A Redis replica stopped with SIGSTOP, behind a Caddy whose store has
// min_replicas 1: new keys get 503 within about replica_timeout and never
// reach the upstream, replays go on, and new keys run again once the
// replica gets SIGCONT.
func TestRedisMinReplicasPausedReplica(t *testing.T) {
	t.Parallel()
	sg := testredis.StartSentinel(t)
	sg.WaitReplicated(t)
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, fmt.Sprintf(`store redis {
		address %s
		master_name %s
		min_replicas 1
		replica_timeout 100ms
	}`, strings.Join(sg.SentinelAddrs(), " "), sg.MasterName())))
	cl := newClient(t)
	mk := func(key string) *http.Request {
		return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`))
	}
	wantStatus(t, "before the pause", send(t, cl, mk("before")), http.StatusCreated)

	sg.Pause(t, sg.InitialReplicaAddr())
	var slowest time.Duration
	for i := range 5 {
		key := fmt.Sprintf("paused-%d", i)
		start := time.Now()
		res := send(t, cl, mk(key))
		slowest = max(slowest, time.Since(start))
		wantProblem(t, "a new key with the replica paused", res, http.StatusServiceUnavailable, "store-unavailable", true)
		wantCount(t, "upstream runs of "+key, u.starts(key), 0)
	}
	if slowest > 600*time.Millisecond {
		t.Errorf("the slowest 503 took %v, want about replica_timeout (100ms)", slowest)
	}
	start := time.Now()
	res := send(t, cl, mk("before"))
	if res.Status != http.StatusCreated || !res.replayed() {
		t.Fatalf("the replay with the replica paused: %s, want the stored 201", res)
	}
	replay := time.Since(start)

	sg.Resume(t, sg.InitialReplicaAddr())
	resumed := time.Now()
	waitForRecovery(t, cl, u, mk, "paused-0")
	wantCount(t, "upstream runs of before", u.starts("before"), 1)
	t.Logf("with the replica paused: 5 new keys answered 503 (slowest %v), none ran; a replay took %v; a new key ran %v after SIGCONT",
		slowest.Round(time.Millisecond), replay.Round(time.Millisecond), time.Since(resumed).Round(time.Millisecond))
}

// The blackholed-link Sentinel failover behind two Caddys on one Sentinel
// group, one with the default min_replicas 0 and one with min_replicas 1:
// clients send new keys throughout; the replication link is cut, then the
// master killed, and Sentinel promotes the replica. Every key answered 201
// before the kill is retried: a retry the upstream runs again is a double
// execution. The default has them; min_replicas 1 has none (its requests
// while the link was cut got 503 instead).
func TestRedisMinReplicasFailover(t *testing.T) {
	t.Parallel()
	sg, link := testredis.StartSentinelBehindLink(t)
	sg.WaitReplicated(t)
	u := startUpstream(t)
	store := func(n int) string {
		return fmt.Sprintf(`store redis {
		address %s
		master_name %s
		key_prefix min%d
		min_replicas %d
		dial_timeout 200ms
		read_timeout 300ms
		write_timeout 300ms
	}`, strings.Join(sg.SentinelAddrs(), " "), sg.MasterName(), n, n)
	}
	caddys := []*caddyProc{startCaddy(t, "min0", proxySite(u, store(0))), startCaddy(t, "min1", proxySite(u, store(1)))}
	cl := newClient(t)
	mk := func(i int, key string) *http.Request {
		return req(http.MethodPost, caddys[i].URL+"/orders", key, []byte(`{"sku":"tea"}`))
	}

	type answered struct {
		key string
		at  time.Time
	}
	var (
		mu      sync.Mutex
		created [2][]answered
		refused [2]int
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for i := range caddys {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("c%d-w%d-%d", i, w, n)
					res, err := do(cl, mk(i, key))
					mu.Lock()
					switch {
					case err != nil:
					case res.Status == http.StatusCreated:
						created[i] = append(created[i], answered{key, time.Now()})
					case res.Status == http.StatusServiceUnavailable:
						refused[i]++
					}
					mu.Unlock()
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
	// The default Caddy answers again once it follows the new master.
	if !eventually(10*time.Second, 50*time.Millisecond, func() bool {
		r, err := do(cl, mk(0, fmt.Sprintf("probe-%d", time.Now().UnixNano())))
		return err == nil && r.Status == http.StatusCreated
	}) {
		t.Fatal("the default Caddy did not recover within 10s of the failover")
	}

	// A retry is a replay, runs the request again, or gets 409 because the
	// new master has the claim but not its completion: then the request
	// runs again once the lease (lock_timeout, 30s) has passed.
	var double, stuck, other [2]int
	for i := range caddys {
		for _, a := range created[i] {
			if a.at.After(killedAt) {
				continue
			}
			var res response
			eventually(3*time.Second, 50*time.Millisecond, func() bool {
				res = send(t, cl, mk(i, a.key))
				return res.Status != http.StatusConflict
			})
			switch {
			case u.starts(a.key) > 1:
				double[i]++
			case res.Status == http.StatusConflict:
				stuck[i]++
			case !res.replayed():
				other[i]++
				t.Logf("%s: retry of %s: %s", caddys[i].name, a.key, res)
			}
		}
	}
	for i, name := range []string{"min_replicas 0", "min_replicas 1"} {
		t.Logf("%s: %d keys answered 201 before the kill; their retries: %d ran a second time, %d got 409 (their completion lost: they run again after the lease); %d requests got 503",
			name, len(created[i]), double[i], stuck[i], refused[i])
	}
	if double[0] == 0 {
		t.Error("the default ran no key twice: the failover did not happen under traffic, and the test proves nothing")
	}
	if double[1] != 0 || stuck[1] != 0 || other[0]+other[1] != 0 {
		t.Errorf("with min_replicas 1, %d keys ran twice and %d retries got 409; %d retries were neither replays nor runs", double[1], stuck[1], other[0]+other[1])
	}
}
