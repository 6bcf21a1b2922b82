package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// The local tier of two instances on one Redis: a replay that one instance
// read once from Redis is served from its tier thereafter, and a purge
// through the other instance's admin API evicts it there, so the key runs
// anew.
func TestLocalCachePurgeAcrossInstances(t *testing.T) {
	t.Parallel()
	rd := testredis.Start(t)
	u := startUpstream(t)
	site := proxySite(u, fmt.Sprintf(`store redis {
	address %s
	local_cache 1MiB
}`, rd.Addr()))
	a, b := startCaddy(t, "A", site), startCaddy(t, "B", site)
	cl := newClient(t)
	body := []byte(`{"sku":"tea"}`)
	mk := func(c *caddyProc) *http.Request { return req(http.MethodPost, c.URL+"/orders", "cached-1", body) }

	first := send(t, cl, mk(a))
	wantStatus(t, "first request, on A", first, http.StatusCreated)
	// B's tier takes records once its subscription is up: until then its
	// replays read Redis.
	if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
		rd.ConfigResetStat(t)
		wantReplay(t, "replay on B", first, send(t, cl, mk(b)))
		return rd.CommandStats(t)["set"] == 0
	}) {
		t.Fatal("B's replays kept reading Redis: its local tier never served one")
	}

	// The purge reaches B's tier over Pub/Sub, in a moment.
	purgeEvictsElsewhere(t, cl, u, a, func() *http.Request { return mk(b) })
}

// The local tier of two instances on one PostgreSQL table: a replay that
// one instance read once is served from its tier thereafter (it answers
// while the table is locked), and a purge through the other instance's
// admin API evicts it there, over LISTEN/NOTIFY, so the key runs anew.
func TestPostgresLocalCachePurgeAcrossInstances(t *testing.T) {
	t.Parallel()
	pg := testpg.Start(t)
	u := startUpstream(t)
	const table = "e2e_local_cache"
	site := proxySite(u, fmt.Sprintf(`store postgres {
	dsn %q
	table %s
	local_cache 1MiB
}`, pg.DSN(), table))
	a, b := startCaddy(t, "A", site), startCaddy(t, "B", site)
	cl := newClient(t)
	body := []byte(`{"sku":"tea"}`)
	mk := func(c *caddyProc) *http.Request { return req(http.MethodPost, c.URL+"/orders", "cached-1", body) }

	first := send(t, cl, mk(a))
	wantStatus(t, "first request, on A", first, http.StatusCreated)
	// B's tier takes records once its listener is up: until then its
	// replays read the table, and one sent while the table is locked
	// waits.
	if !eventually(15*time.Second, 50*time.Millisecond, func() bool {
		wantReplay(t, "replay on B", first, send(t, cl, mk(b)))
		unlock := lockTable(t, pg, table)
		defer unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		res, err := do(cl, mk(b).WithContext(ctx))
		return err == nil && res.replayed()
	}) {
		t.Fatal("B never replayed while the table was locked: its local tier never served")
	}

	purgeEvictsElsewhere(t, cl, u, a, func() *http.Request { return mk(b) })
}

// purgeEvictsElsewhere purges the key cached-1 through a's admin API and
// waits until the request mk makes on the other instance runs anew
// instead of being replayed from its local tier.
func purgeEvictsElsewhere(t *testing.T, cl *http.Client, u *upstream, a *caddyProc, mk func() *http.Request) {
	t.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", a.adminPort)
	if out, err := exec.Command(caddyBin, "idempotency", "purge", "--address", admin, "--key", "cached-1").CombinedOutput(); err != nil {
		t.Fatalf("caddy idempotency purge on A: %v\n%s", err, out)
	}
	start := time.Now()
	var res response
	if !eventually(5*time.Second, 5*time.Millisecond, func() bool {
		res = send(t, cl, mk())
		return !res.replayed()
	}) {
		t.Fatal("B still replays the purged record 5s after the purge")
	}
	wantStatus(t, "request on B after the purge", res, http.StatusCreated)
	wantCount(t, "upstream runs", u.starts("cached-1"), 2)
	t.Logf("B ran the purged key anew %v after the purge returned", time.Since(start).Round(time.Millisecond))
}

// lockTable locks table against every statement until the returned
// function is called.
func lockTable(t testing.TB, pg *testpg.Server, table string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	}
	if err != nil {
		conn.Close(ctx)
		t.Fatalf("locking %s: %v", table, err)
	}
	return func() {
		_ = tx.Rollback(ctx)
		conn.Close(ctx)
	}
}

// How long a waiting duplicate on one instance takes to answer after the
// owner on another has answered: instances A and B share one Redis, or one
// PostgreSQL table, the owner runs on A (the upstream takes 200ms), its
// duplicate waits on B (on_conflict wait). Set WAKEUP_TRIALS (for example
// 60) to run it; it prints the percentiles of the delay and asserts
// nothing about them, as the machine may be loaded. CADDY_BIN chooses the
// build to measure; -run TestWakeupLatencyAcrossInstances/postgres one
// store.
func TestWakeupLatencyAcrossInstances(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("WAKEUP_TRIALS"))
	if trials <= 0 {
		t.Skip("a measurement: set WAKEUP_TRIALS to run it")
	}
	t.Run("redis", func(t *testing.T) {
		measureWakeup(t, trials, redisStore(testredis.Start(t)))
	})
	t.Run("postgres", func(t *testing.T) {
		measureWakeup(t, trials, pgStore(testpg.Start(t), "e2e_wakeup"))
	})
}

func measureWakeup(t *testing.T, trials int, storeOptions string) {
	u := startUpstream(t)
	site := proxySite(u, storeOptions+"\non_conflict wait 10s")
	a, b := startCaddy(t, "A", site), startCaddy(t, "B", site)
	cl := newClient(t)
	body := []byte(`{"sku":"tea"}`)

	trial := func(key string) time.Duration {
		type answer struct {
			res response
			at  time.Time
			err error
		}
		answered := func(ch chan<- answer, r *http.Request) {
			res, err := do(cl, r)
			ch <- answer{res, time.Now(), err}
		}
		owner, waiter := make(chan answer, 1), make(chan answer, 1)
		go answered(owner, req(http.MethodPost, a.URL+"/orders", key, body, hdrDelay, "200ms"))
		if !eventually(5*time.Second, time.Millisecond, func() bool { return u.starts(key) == 1 }) {
			t.Fatalf("%s: the owner's request never reached the upstream", key)
		}
		go answered(waiter, req(http.MethodPost, b.URL+"/orders", key, body))
		o, w := <-owner, <-waiter
		switch {
		case o.err != nil || w.err != nil:
			t.Fatalf("%s: owner %v, waiter %v", key, o.err, w.err)
		case o.res.Status != http.StatusCreated || !w.res.replayed():
			t.Fatalf("%s: owner answered %s, waiter %s; want 201 and its replay", key, o.res, w.res)
		}
		wantCount(t, key+": upstream runs", u.starts(key), 1)
		return w.at.Sub(o.at)
	}

	trial("warm-up") // B's subscription starts with its first waiter
	delays := make([]time.Duration, trials)
	for i := range delays {
		delays[i] = trial("wake-" + strconv.Itoa(i))
	}
	slices.Sort(delays)
	at := func(p int) time.Duration { return delays[(len(delays)*p+99)/100-1] }
	slowest := delays[max(0, len(delays)-5):]
	t.Logf("waiter on B answered after the owner on A, over %d trials: p50 %v, p90 %v, p99 %v, max %v (min %v); slowest %v",
		trials, at(50), at(90), at(99), delays[len(delays)-1], delays[0], slowest)
}
