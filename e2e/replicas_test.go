package e2e

import (
	"fmt"
	"net/http"
	"strings"
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
