package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// A reload that changes the store block (here the pool size; a password
// rotation or a timeout does the same) gives the new config a new client,
// and the old config's client must serve its requests until they have
// stored their answers: 16 clients send keyed requests, each key one to
// three times, while the config is reloaded 20 times. No key may run
// twice, no request may get 503, and the old clients must be closed once
// drained: the store's connections stay bounded.
func TestReloadChangingStore(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rd := testredis.Start(t)
		block := func(pool int) string {
			return fmt.Sprintf("store redis {\n\taddress %s\n\tpool_size %d\n}", rd.Addr(), pool)
		}
		connections := func() (int, error) {
			info, err := rd.Client().Info(context.Background(), "clients").Result()
			if err != nil {
				return 0, err
			}
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
					return strconv.Atoi(v)
				}
			}
			return 0, fmt.Errorf("no connected_clients in INFO clients: %q", info)
		}
		// One pool of at most 17, its Pub/Sub connection, and the test's.
		t.Run("route", func(t *testing.T) { reloadUnderLoad(t, block, false, connections, 17+1+1) })
		// The idempotency app's shared store, in the global options.
		t.Run("app", func(t *testing.T) { reloadUnderLoad(t, block, true, connections, 17+1+1) })
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testpg.Start(t)
		block := func(pool int) string {
			return fmt.Sprintf("store postgres {\n\tdsn %q\n\tmax_conns %d\n}", pg.DSN(), pool)
		}
		connections := func() (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, pg.DSN())
			if err != nil {
				return 0, err
			}
			defer conn.Close(ctx)
			var n int
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n)
			return n, err
		}
		// One pool of at most 17 and its listening connection.
		reloadUnderLoad(t, block, false, connections, 17+1)
	})
}

// reloadUnderLoad runs the scenario with the store block block(16) and
// block(17) in turn, in the route or, if global, in the global options,
// and checks the connections that connections counts against limit once
// the reloads are over.
func reloadUnderLoad(t *testing.T, block func(pool int) string, global bool, connections func() (int, error), limit int) {
	const (
		clients = 16
		reloads = 20
		pause   = 150 * time.Millisecond // between reloads
	)
	u := startUpstream(t)
	// A short lease, so that a completion lost in a reload shows as a
	// second run of its retry within the test rather than as 409s.
	site := func(pool int) string { return proxySite(u, block(pool)+"\nlock_timeout 2s") }
	c := startCaddy(t, "caddy", site(16))
	config := func(pool int) string {
		if !global {
			return makeCaddyfile(c.port, c.adminPort, site(pool))
		}
		app := "\tidempotency {\n\t\t" + strings.ReplaceAll(block(pool), "\n", "\n\t\t") + "\n\t}\n"
		cf := makeCaddyfile(c.port, c.adminPort, proxySite(u, "lock_timeout 2s"))
		return strings.Replace(cf, "{\n", "{\n"+app, 1)
	}
	if global {
		if err := c.Load(config(16)); err != nil {
			t.Fatal(err)
		}
	}

	var (
		stop                            atomic.Bool
		keys, sends, unavailable, drops atomic.Int64
		mu                              sync.Mutex
		others                          []string // unexpected answers, a few
		wg                              sync.WaitGroup
		made                            [clients]int // keys per client
	)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := newClient(t)
			for k := 0; !stop.Load(); k++ {
				key := fmt.Sprintf("reload-%d-%d", i, k)
				keys.Add(1)
				made[i] = k + 1
				for range 1 + rand.IntN(3) {
					r := sendSettled(cl, c.URL, key, &sends, &drops)
					switch {
					case r.Status == http.StatusCreated:
					case r.Status == http.StatusServiceUnavailable:
						unavailable.Add(1)
					default:
						mu.Lock()
						if len(others) < 5 {
							others = append(others, fmt.Sprintf("%s: %s", key, r))
						}
						mu.Unlock()
					}
				}
			}
		}()
	}

	start := time.Now()
	for i := 1; i <= reloads; i++ {
		time.Sleep(pause)
		if err := c.Load(config(16 + i%2)); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	time.Sleep(pause) // the last config serves a while, too
	stop.Store(true)
	wg.Wait()
	took := time.Since(start)

	twice := 0
	var examples []string
	for i := range clients {
		for k := range made[i] {
			key := fmt.Sprintf("reload-%d-%d", i, k)
			if n := u.starts(key); n > 1 {
				twice++
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("%s ran %d times", key, u.starts(key)))
				}
			}
		}
	}
	var conns int
	// Sooner than lock_timeout plus the drain margin (2s+5s), after which a
	// replaced store is closed whatever holds it: a hold never given back
	// fails here too.
	settled := eventually(4*time.Second, 100*time.Millisecond, func() bool {
		n, err := connections()
		if err != nil {
			t.Logf("counting connections: %v", err)
			return false
		}
		conns = n
		return n <= limit
	})
	t.Logf("%d reloads in %v: %d keys, %d requests; %d keys ran twice, %d answers 503, %d transport errors resent; %d store connections after (limit %d)",
		reloads, took.Round(time.Millisecond), keys.Load(), sends.Load(), twice, unavailable.Load(), drops.Load(), conns, limit)
	c.wantAlive("after the reloads")
	if twice > 0 || unavailable.Load() > 0 {
		t.Logf("caddy's warnings and errors:\n%s", complaints(c.Log()))
	}
	if twice > 0 {
		t.Errorf("%d keys ran twice, e.g. %v", twice, examples)
	}
	if n := unavailable.Load(); n > 0 {
		t.Errorf("%d answers were 503", n)
	}
	if len(others) > 0 {
		t.Errorf("unexpected answers, e.g. %v", others)
	}
	if !settled {
		t.Errorf("%d store connections 4s after the reloads, want at most %d: a pool was leaked", conns, limit)
	}
}

// sendSettled sends one keyed request, taking 5ms at the upstream, and
// resends it, as a client would, while the answer is a transport error or
// 409 outstanding, for up to 10s.
func sendSettled(cl *http.Client, url, key string, sends, drops *atomic.Int64) response {
	deadline := time.Now().Add(10 * time.Second)
	for {
		sends.Add(1)
		r, err := do(cl, req(http.MethodPost, url+"/orders", key, []byte(`{"sku":"tea"}`), hdrDelay, "5ms"))
		switch {
		case err != nil:
			drops.Add(1)
		case r.Status != http.StatusConflict || problemAnchor(r) != "outstanding":
			return r
		}
		if time.Now().After(deadline) {
			return r
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// complaints counts the distinct warnings and errors in a caddy log, by
// message and error text.
func complaints(log string) string {
	counts := make(map[string]int)
	for line := range strings.Lines(log) {
		var e struct{ Level, Msg, Error string }
		if json.Unmarshal([]byte(line), &e) != nil || (e.Level != "warn" && e.Level != "error") {
			continue
		}
		counts[e.Level+": "+e.Msg+": "+e.Error]++
	}
	var b strings.Builder
	for _, m := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(&b, "%5d %s\n", counts[m], m)
	}
	return b.String()
}
