package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
)

// pgStore is the store block for table in pg's database.
func pgStore(pg *testpg.Server, table string) string {
	return fmt.Sprintf(`store postgres {
	dsn %q
	table %s
}`, pg.DSN(), table)
}

// The protocol, concurrency, disconnect and crash scenarios with the
// postgres store. The subtests share one private PostgreSQL server, each
// with its own table.
func TestPostgresStore(t *testing.T) {
	t.Parallel()
	pg := testpg.Start(t)

	t.Run("protocol", func(t *testing.T) {
		t.Parallel()
		const table = "e2e_protocol"
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, pgStore(pg, table)))
		first := durableProtocol(t, u, c)

		// The records are rows of the configured table, completed, with
		// the bodies as sent.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.DSN())
		if err != nil {
			t.Fatalf("connecting to postgres: %v", err)
		}
		defer conn.Close(context.Background())
		rows, err := conn.Query(ctx, "SELECT state, status, body FROM "+table)
		if err != nil {
			t.Fatalf("reading %s: %v", table, err)
		}
		var n int
		var sawJSON, sawBlob bool
		for rows.Next() {
			var state string
			var status int
			var body []byte
			if err := rows.Scan(&state, &status, &body); err != nil {
				t.Fatal(err)
			}
			n++
			if state != "completed" || status != http.StatusCreated {
				t.Errorf("row %d: state %q status %d, want completed 201", n, state, status)
			}
			sawJSON = sawJSON || bytes.Equal(body, first.Body)
			sawBlob = sawBlob || bytes.Equal(body, pattern(blobSize))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != 2 || !sawJSON || !sawBlob {
			t.Fatalf("table %s holds %d rows (JSON answer found: %t, binary answer found: %t); want the 2 answers", table, n, sawJSON, sawBlob)
		}
	})

	t.Run("concurrent_duplicates", func(t *testing.T) {
		t.Parallel()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, pgStore(pg, "e2e_concurrent")))
		concurrentDuplicates(t, u, []*caddyProc{c}, "api.test")
	})

	t.Run("client_disconnect", func(t *testing.T) {
		t.Parallel()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, pgStore(pg, "e2e_disconnect")))
		durableClientDisconnect(t, u, c)
	})

	// Two instances that share one table run a key once between them, and
	// the instance that lost the race replays the winner's answer.
	t.Run("two_instances", func(t *testing.T) {
		t.Parallel()
		u := startUpstream(t)
		site := proxySite(u, pgStore(pg, "e2e_shared"))
		a := startCaddy(t, "A", site)
		b := startCaddy(t, "B", site)
		winner := concurrentDuplicates(t, u, []*caddyProc{a, b}, "")
		t.Logf("instance %s ran the request; instance %s replayed it", []string{"A", "B"}[winner], []string{"A", "B"}[1-winner])
	})

	// The instance that owns a claim dies during the upstream call; the
	// other refuses retries until the lease passes, then runs the request
	// again (the documented price of a crash during the upstream call).
	t.Run("owner_killed", func(t *testing.T) {
		t.Parallel()
		ownerKilledTakeover(t, pgStore(pg, "e2e_owner_killed"), 3*time.Second, false)
	})
	// The same with on_unknown_outcome keep: at most once, 502 after the
	// lease instead of a second run.
	t.Run("owner_killed_keep", func(t *testing.T) {
		t.Parallel()
		ownerKilledTakeover(t, pgStore(pg, "e2e_owner_killed_keep"), 3*time.Second, true)
	})
}

// PostgreSQL dies under traffic: with fail_closed every request is refused
// with 503 and nothing reaches the upstream; a Caddy started meanwhile
// starts and refuses too; once PostgreSQL is back both serve again without
// a restart, and the keys refused during the outage run once when retried.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	pg := testpg.Start(t)
	u := startUpstream(t)
	site := proxySite(u, pgStore(pg, "e2e_outage")+"\non_store_error fail_closed\nlock_timeout 2s")
	a := startCaddy(t, "A", site)
	cl := newClient(t)
	mk := func(c *caddyProc, key string) func() *http.Request {
		return func() *http.Request {
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`))
		}
	}
	before := send(t, cl, mk(a, "before")())
	wantStatus(t, "before the outage", before, http.StatusCreated)

	// Traffic: a few clients send new keys back to back.
	type result struct {
		key    string
		status int
		anchor string
		err    error
		sent   time.Time
	}
	var (
		mu      sync.Mutex
		results []result
		seq     atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("traffic-%d-%d", w, seq.Add(1))
				sent := time.Now()
				res, err := do(cl, mk(a, key)())
				mu.Lock()
				results = append(results, result{key, res.Status, problemAnchor(res), err, sent})
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	pg.Kill()
	killed := time.Now()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	var ok, refusedBefore, refusedAfter int
	var refused []string
	for _, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.key, r.err)
		case r.status == http.StatusCreated:
			if r.sent.After(killed) {
				t.Errorf("%s sent %v after PostgreSQL was killed ran (201)", r.key, r.sent.Sub(killed))
			}
			ok++
		case r.status == http.StatusServiceUnavailable && r.anchor == "store-unavailable":
			if n := u.starts(r.key); n != 0 {
				t.Errorf("%s was refused with 503 but reached the upstream %d times", r.key, n)
			}
			// Those in flight at the kill are the likeliest to have left a
			// claim behind: they are retried first.
			if r.sent.After(killed) {
				refusedAfter++
				refused = append(refused, r.key)
			} else {
				refusedBefore++
				refused = append([]string{r.key}, refused...)
			}
		default:
			t.Errorf("%s: unexpected answer %d %q", r.key, r.status, r.anchor)
		}
	}
	t.Logf("traffic: %d requests ran before the kill, %d in flight at the kill and %d after it were refused with 503",
		ok, refusedBefore, refusedAfter)
	if ok == 0 || refusedAfter == 0 {
		t.Fatalf("the traffic did not span the kill: %d ran, %d refused after it", ok, refusedAfter)
	}
	for i := range 3 {
		res := send(t, cl, mk(a, "during")())
		wantProblem(t, fmt.Sprintf("request %d while PostgreSQL is down", i), res, http.StatusServiceUnavailable, "store-unavailable", true)
	}
	wantCount(t, "upstream runs while PostgreSQL is down", u.starts("during"), 0)

	// A Caddy that starts while PostgreSQL is down starts, and refuses.
	b := startCaddy(t, "B", site)
	res := send(t, cl, mk(b, "early")())
	wantProblem(t, "request to B before PostgreSQL is up", res, http.StatusServiceUnavailable, "store-unavailable", true)
	wantCount(t, "upstream runs before PostgreSQL is up", u.starts("early"), 0)

	pg.Restart(t)
	restarted := time.Now()
	for _, c := range []*caddyProc{a, b} {
		key := "after-" + c.name
		pgRecovery(t, cl, u, mk(c, key), key, c.name, restarted)
	}
	// A request refused during the outage may have left a claim (its
	// INSERT committed, its answer lost): a retry gets 409 at most until
	// that lease passes, then runs once.
	for i, key := range refused {
		if i == 5 {
			break
		}
		retry, conflicts := retryUntilSettled(t, cl, mk(a, key), lease+10*time.Second)
		wantStatus(t, "retry of "+key+" refused during the outage", retry, http.StatusCreated)
		if retry.replayed() {
			t.Fatalf("retry of %s refused during the outage was a replay: %s", key, retry)
		}
		wantCount(t, "upstream runs of "+key, u.starts(key), 1)
		if conflicts > 0 {
			t.Logf("retry of %s got %d x 409 first (a claim committed during the kill)", key, conflicts)
		}
	}
	replay, _ := retryUntilSettled(t, cl, mk(a, "before"), 10*time.Second)
	wantReplay(t, "the key completed before the outage", before, replay)
	wantCount(t, "upstream runs of the key before the outage", u.starts("before"), 1)
	for _, c := range []*caddyProc{a, b} {
		if strings.Contains(c.Log(), "panic") {
			t.Errorf("caddy %s logged a panic", c.name)
		}
	}
}

// pgRecovery polls with key until the request runs (201), then checks that
// it ran once and that a retry replays it.
func pgRecovery(t *testing.T, cl *http.Client, u *upstream, mk func() *http.Request, key, name string, since time.Time) {
	t.Helper()
	var res response
	unavailable := 0
	if !eventually(20*time.Second, 50*time.Millisecond, func() bool {
		res = send(t, cl, mk())
		if res.Status == http.StatusServiceUnavailable {
			wantProblem(t, "request while PostgreSQL comes back", res, http.StatusServiceUnavailable, "store-unavailable", true)
			unavailable++
		}
		return res.Status != http.StatusServiceUnavailable
	}) {
		t.Fatalf("caddy %s did not resume within 20s after PostgreSQL came back: %s", name, res)
	}
	wantStatus(t, "first request after PostgreSQL came back", res, http.StatusCreated)
	if res.replayed() {
		t.Fatalf("first request after PostgreSQL came back was a replay: %s", res)
	}
	t.Logf("caddy %s resumed %v after PostgreSQL came back (%d x 503 meanwhile)", name, time.Since(since).Round(time.Millisecond), unavailable)
	wantCount(t, "upstream runs after PostgreSQL came back", u.starts(key), 1)
	replay, _ := retryUntilSettled(t, cl, mk, 10*time.Second)
	wantReplay(t, "retry after PostgreSQL came back", res, replay)
	wantCount(t, "upstream runs after the retry", u.starts(key), 1)
}
