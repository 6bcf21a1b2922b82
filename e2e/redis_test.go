package e2e

import (
	"context"
	"fmt"
	goredis "github.com/redis/go-redis/v9"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// Two Caddy instances that share one Redis run a key once between
// them, and the instance that lost the race replays the winner's answer.
func TestTwoInstancesShareRedis(t *testing.T) {
	t.Parallel()
	rd := testredis.Start(t)
	u := startUpstream(t)
	site := proxySite(u, redisStore(rd))
	a := startCaddy(t, "A", site)
	b := startCaddy(t, "B", site)
	// Each request carries the Host of the instance it is sent to, one
	// port each: the key is bound to the host without its port.
	winner := concurrentDuplicates(t, u, []*caddyProc{a, b}, "")
	t.Logf("instance %s ran the request; instance %s replayed it", []string{"A", "B"}[winner], []string{"A", "B"}[1-winner])
}

// An instance dies while it owns a claim. The other instance
// refuses retries until the lease passes, then runs the request again: a
// crashed owner leaves no response to replay, so the second run is the
// documented price of the crash.
func TestOwnerKilledLeaseTakeover(t *testing.T) {
	t.Parallel()
	ownerKilledTakeover(t, redisStore(testredis.Start(t)), time.Second, false)
}

// The same crash with on_unknown_outcome keep: the retry that takes the
// dead owner's claim over gets 502 outcome-unknown, and the request never
// runs a second time (at most once).
func TestOwnerKilledKeepIsAtMostOnce(t *testing.T) {
	t.Parallel()
	ownerKilledTakeover(t, redisStore(testredis.Start(t)), time.Second, true)
}

// Redis outages, with both on_store_error policies, and a Caddy
// that starts while Redis is down.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, options string) (*testredis.Server, *upstream, *caddyProc, func(key string) *http.Request) {
		rd := testredis.Start(t)
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, redisStore(rd)+"\n"+options))
		mk := func(key string) *http.Request {
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`))
		}
		return rd, u, c, mk
	}

	t.Run("fail_closed", func(t *testing.T) {
		t.Parallel()
		rd, u, _, mk := setup(t, "on_store_error fail_closed")
		cl := newClient(t)
		wantStatus(t, "before the outage", send(t, cl, mk("before")), http.StatusCreated)

		rd.Kill()
		for i := range 3 {
			res := send(t, cl, mk("during"))
			wantProblem(t, fmt.Sprintf("request %d while Redis is down", i), res, http.StatusServiceUnavailable, "store-unavailable", true)
		}
		wantCount(t, "upstream runs while Redis is down", u.starts("during"), 0)

		rd.Restart(t)
		waitForRecovery(t, cl, u, mk, "during")
	})

	t.Run("fail_open", func(t *testing.T) {
		t.Parallel()
		rd, u, c, mk := setup(t, "on_store_error fail_open")
		cl := newClient(t)
		rd.Kill()
		for i := 1; i <= 2; i++ {
			res := send(t, cl, mk("open"))
			wantStatus(t, "request while Redis is down", res, http.StatusCreated)
			if res.replayed() {
				t.Fatalf("request %d while Redis is down was replayed: %s", i, res)
			}
			// Unprotected: every request runs.
			wantCount(t, "upstream runs while Redis is down", u.starts("open"), i)
		}
		if !strings.Contains(c.Log(), "fail_open") {
			t.Error("the unprotected requests were not logged")
		}
	})

	t.Run("down_at_startup", func(t *testing.T) {
		t.Parallel()
		rd := testredis.Start(t)
		rd.Kill()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, redisStore(rd)))
		cl := newClient(t)
		mk := func(key string) *http.Request {
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`))
		}
		res := send(t, cl, mk("early"))
		wantProblem(t, "request before Redis is up", res, http.StatusServiceUnavailable, "store-unavailable", true)
		wantCount(t, "upstream runs before Redis is up", u.starts("early"), 0)

		rd.Restart(t)
		waitForRecovery(t, cl, u, mk, "early")
	})
}

// waitForRecovery polls with key until the request runs (201), then checks
// that it ran once and that a retry replays it.
func waitForRecovery(t *testing.T, cl *http.Client, u *upstream, mk func(string) *http.Request, key string) {
	t.Helper()
	start := time.Now()
	var res response
	unavailable := 0
	if !eventually(5*time.Second, 50*time.Millisecond, func() bool {
		res = send(t, cl, mk(key))
		if res.Status == http.StatusServiceUnavailable {
			wantProblem(t, "request while Redis comes back", res, http.StatusServiceUnavailable, "store-unavailable", true)
			unavailable++
		}
		return res.Status != http.StatusServiceUnavailable
	}) {
		t.Fatalf("service did not resume within 5s after Redis came back: %s", res)
	}
	wantStatus(t, "first request after Redis came back", res, http.StatusCreated)
	if res.replayed() {
		t.Fatalf("first request after Redis came back was a replay: %s", res)
	}
	t.Logf("service resumed %v after Redis came back (%d x 503 meanwhile)", time.Since(start).Round(time.Millisecond), unavailable)
	wantCount(t, "upstream runs after Redis came back", u.starts(key), 1)
	replay, _ := retryUntilSettled(t, cl, func() *http.Request { return mk(key) }, 5*time.Second)
	wantReplay(t, "retry after Redis came back", res, replay)
	wantCount(t, "upstream runs after the retry", u.starts(key), 1)
}

// A Redis that stalls longer than the client's timeouts (here a 3.5s busy
// script) makes Acquire fail, and the handler answers 503 "not processed,
// retry later". But the claim's SET was only delayed, not lost: Redis
// stores it when the stall ends.
//
// The handler withdraws such a claim in the background, so the retries the
// 503 asked for run instead of getting 409 for a whole lock_timeout.
func TestRedisStallLeavesNoPhantomClaim(t *testing.T) {
	t.Parallel()
	rd := testredis.Start(t)
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, redisStore(rd)+"\nlock_timeout 10s"))
	cl := newClient(t)
	mk := func() *http.Request {
		return req(http.MethodPost, c.URL+"/orders", "stall-1", []byte(`{"sku":"tea"}`))
	}
	stalled := make(chan error, 1)
	go func() {
		stalled <- rd.Client().Eval(context.Background(), `
local s = redis.call('TIME')
while true do
	local n = redis.call('TIME')
	if (n[1]-s[1])*1000000 + (n[2]-s[2]) > 3500000 then break end
end
return 1`, nil).Err()
	}()
	// Send only once Redis is really stuck in the script: on a loaded
	// machine the request could otherwise claim the key before it starts.
	probe := goredis.NewClient(&goredis.Options{Addr: rd.Addr(), ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer probe.Close()
	if !eventually(2*time.Second, 10*time.Millisecond, func() bool {
		return probe.Ping(context.Background()).Err() != nil
	}) {
		t.Fatal("the stalling script never blocked Redis")
	}
	res := send(t, cl, mk())
	wantProblem(t, "request while Redis stalls", res, http.StatusServiceUnavailable, "store-unavailable", true)
	if err := <-stalled; err != nil {
		t.Fatalf("stalling Redis: %v", err)
	}
	wantCount(t, "upstream runs during the stall", u.starts("stall-1"), 0)

	// Redis answers again: the retry the 503 asked for must run.
	var r response
	if !eventually(3*time.Second, 50*time.Millisecond, func() bool {
		r = send(t, cl, mk())
		return r.Status == http.StatusCreated
	}) {
		t.Fatalf("3s after Redis recovered, the retry still gets %s (upstream runs: %d)", r, u.starts("stall-1"))
	}
	wantCount(t, "upstream runs", u.starts("stall-1"), 1)
}
