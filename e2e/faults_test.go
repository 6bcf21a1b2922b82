package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// The fault-injection suite: real Caddy processes, a real redis-server,
// broken on purpose. Every case checks the same invariants: per key the
// upstream ran at most once unless the README allows a second run (the
// owner crashed during the upstream call, or the upstream answered 5xx);
// every client got a well-formed answer (the upstream's, a replay, a 409 or
// a 503 problem); and no key stays locked for longer than lock_timeout once
// its request is over.

// Three Caddy instances share one Redis. 50 concurrent duplicates, spread
// round-robin over them, run the upstream once: with on_conflict reject the
// 49 others get 409 at once; with on_conflict wait they all get the same
// 201, 49 of them replayed.
func TestFaultThreeInstancesShareRedis(t *testing.T) {
	t.Parallel()
	rd := testredis.Start(t)
	rejectUp, waitUp := startUpstream(t), startUpstream(t)
	site := fmt.Sprintf(`route /wait/* {
	idempotency {
		%[1]s
		on_conflict wait 10s
	}
	reverse_proxy %[2]s
}
route {
	idempotency {
		%[1]s
	}
	reverse_proxy %[3]s
}`, redisStore(rd), waitUp.host(), rejectUp.host())
	var instances []*caddyProc
	for _, name := range []string{"A", "B", "C"} {
		instances = append(instances, startCaddy(t, name, site))
	}

	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		winner := concurrentDuplicates(t, rejectUp, instances, "api.test")
		t.Logf("on_conflict reject: instance %s ran the one execution; 49 x 409, then 30 replays over the 3 instances",
			instances[winner].name)
	})

	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		const n = 50
		const key = "dup-wait-1"
		body := []byte(`{"amount":1000,"currency":"EUR"}`)
		mk := func(i int) *http.Request {
			return req(http.MethodPost, instances[i%len(instances)].URL+"/wait/payments", key, body,
				hdrGate, "1", "Host", "api.test")
		}
		cl := newClient(t)
		results, errs, answered, wg := fanOut(cl, n, mk)
		select {
		case <-waitUp.startedCh(key):
		case <-time.After(15 * time.Second):
			waitUp.openGate()
			t.Fatal("no request reached the upstream")
		}
		// Let the duplicates arrive and wait; none may be answered while
		// the first one runs.
		time.Sleep(1500 * time.Millisecond)
		early := answered.Load()
		waitUp.openGate()
		opened := time.Now()
		if !waitGroupWithin(wg, 20*time.Second) {
			t.Fatalf("only %d of %d requests answered 20s after the upstream answered", answered.Load(), n)
		}
		if early > 0 {
			t.Errorf("%d duplicates were answered while the first request ran (on_conflict wait 10s)", early)
		}
		winner, replays := -1, 0
		for i, r := range results {
			switch {
			case errs[i] != nil:
				t.Errorf("request %d: %v", i, errs[i])
			case r.Status == http.StatusCreated && !r.replayed():
				if winner >= 0 {
					t.Errorf("requests %d and %d both ran", winner, i)
				}
				winner = i
			case r.Status == http.StatusCreated:
				replays++
			default:
				t.Errorf("request %d: got %s, want the 201 or its replay", i, r)
			}
		}
		wantCount(t, "upstream runs", waitUp.starts(key), 1)
		if t.Failed() || winner < 0 {
			t.FailNow()
		}
		wantCount(t, "replays", replays, n-1)
		for i, r := range results {
			if i != winner {
				wantReplay(t, fmt.Sprintf("waiting duplicate %d (instance %s)", i, instances[i%len(instances)].name), results[winner], r)
			}
		}
		if !bytes.Equal(results[winner].Body, waitUp.sentBody(key, 1)) {
			t.Fatalf("the first answer %q differs from what the upstream sent %q", results[winner].Body, waitUp.sentBody(key, 1))
		}
		t.Logf("on_conflict wait: instance %s ran the one execution; %d waiting duplicates got the replay, all answered %v after the upstream answered",
			instances[winner%len(instances)].name, replays, time.Since(opened).Round(time.Millisecond))
		wantReplay(t, "retry afterwards", results[winner], send(t, cl, mk(1)))
		wantCount(t, "upstream runs after the retry", waitUp.starts(key), 1)
	})
}

// Redis is SIGKILLed and restarted, twice, while 8 clients send new keys to
// two Caddy instances, each key retried until it settles. Caddy stays up,
// answers only the upstream's 201, a replay, 409 or 503 (fail_closed),
// never runs a key twice, and serves again by itself once Redis is back.
func TestFaultRedisKilledUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		lease   = 2 * time.Second
		workers = 8
		settle  = 20 * time.Second // a key must settle within this
	)
	rd := testredis.Start(t)
	u := startFaultUpstream(t)
	options := redisStore(rd) + "\nlock_timeout 2s"
	instances := []*caddyProc{
		startCaddy(t, "A", faultSite(u, "A", options, 5*time.Second)),
		startCaddy(t, "B", faultSite(u, "B", options, 5*time.Second)),
	}
	cl := newClient(t)

	var (
		v       violations
		counts  tally
		stop    atomic.Bool
		mu      sync.Mutex
		settled = map[string]outcome{} // key -> the answer that settled it
		firstAt = map[string]time.Time{}
		news    []outcome // every new execution's answer
	)
	work := func(w int) {
		rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
		for i := 0; !stop.Load(); i++ {
			key := fmt.Sprintf("redis-kill-%d-%d", w, i)
			mk := func(attempt int) *http.Request {
				return req(http.MethodPost, instances[(w+attempt)%2].URL+"/orders", key, []byte(`{"key":"`+key+`"}`),
					"Host", "api.test", fHdrLatency, ms(randDuration(rng, 10*time.Millisecond, 100*time.Millisecond)), fHdrChunks, "2")
			}
			begin := time.Now()
			var streak time.Time // when the current run of 409s began
			for attempt := 0; ; attempt++ {
				o := fetch(cl, mk(attempt), -1)
				counts.add("requests", 1)
				if attempt == 0 {
					mu.Lock()
					firstAt[key] = o.sent
					mu.Unlock()
				}
				done := false
				if o.err != nil {
					counts.add("transport errors", 1)
					v.add("key %s attempt %d: transport error %v (no Caddy was killed)", key, attempt, o.err)
				} else {
					kind, err := classify(o.res)
					counts.add(kind, 1)
					if err != nil {
						v.add("key %s attempt %d: malformed answer: %v", key, attempt, err)
					}
					switch kind {
					case kindNew, kindReplay:
						mu.Lock()
						settled[key] = o
						if kind == kindNew {
							news = append(news, o)
						}
						mu.Unlock()
						done = true
					case kindConflict:
						if streak.IsZero() {
							streak = o.sent
						} else if o.sent.Sub(streak) > lease+3*time.Second {
							v.add("key %s still 409 %v after its first 409 (lock_timeout %v)", key, o.sent.Sub(streak), lease)
							done = true
						}
					case kindUnavailable:
						streak = time.Time{}
					default:
						v.add("key %s attempt %d: unexpected answer %s", key, attempt, o.res)
					}
				}
				if done {
					break
				}
				if time.Since(begin) > settle {
					v.add("key %s did not settle within %v", key, settle)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(w)
		}()
	}

	// The faults, from the test goroutine: two kills, a long and a short
	// outage.
	type outage struct{ killed, restarted time.Time }
	var outages []outage
	for _, o := range []struct{ before, down time.Duration }{{1200 * time.Millisecond, 800 * time.Millisecond}, {1500 * time.Millisecond, 200 * time.Millisecond}} {
		time.Sleep(o.before)
		rd.Kill()
		killed := time.Now()
		time.Sleep(o.down)
		rd.Restart(t)
		outages = append(outages, outage{killed, time.Now()})
	}
	time.Sleep(1500 * time.Millisecond)
	stop.Store(true)
	if !waitGroupWithin(&wg, settle+10*time.Second) {
		t.Fatal("the clients did not finish")
	}
	for _, c := range instances {
		c.wantAlive("after Redis was killed and restarted under load")
	}
	if !u.quiesce(10 * time.Second) {
		v.add("the upstream still serves %d requests 10s after the load stopped", u.inflight.Load())
	}

	// At most one run per key, exactly one per settled key, and the body a
	// client got is the one the upstream sent.
	keys := u.allKeys()
	for _, key := range keys {
		if runs := u.runs(key); len(runs) > 1 {
			v.add("key %s ran %d times (runs started at %v and %v)", key, len(runs), runs[0].Start.Format("15:04:05.000"), runs[1].Start.Format("15:04:05.000"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for key, o := range settled {
		runs := u.runs(key)
		if len(runs) != 1 {
			v.add("key %s settled with %s but ran %d times", key, o.res, len(runs))
			continue
		}
		if !bytes.Equal(o.res.Body, runs[0].Body) {
			v.add("key %s: the client got %q, the upstream sent %q", key, o.res.Body, runs[0].Body)
		}
	}

	// Service resumed by itself: the first new execution asked for after
	// each restart.
	var recovery []time.Duration
	for i, out := range outages {
		first := time.Time{}
		for _, o := range news {
			if o.sent.After(out.restarted) && (first.IsZero() || o.done.Before(first)) {
				first = o.done
			}
		}
		if first.IsZero() {
			v.add("no new key ran after Redis restart %d", i+1)
			continue
		}
		recovery = append(recovery, first.Sub(out.restarted))
		if first.Sub(out.restarted) > 5*time.Second {
			v.add("service resumed %v after Redis restart %d", first.Sub(out.restarted), i+1)
		}
	}

	// Keys settled after the last restart replay (no data was lost since).
	last := outages[len(outages)-1].restarted
	replayed := 0
	for key, o := range settled {
		if !firstAt[key].After(last) {
			continue
		}
		r, _ := retryUntilSettled(t, cl, func() *http.Request {
			return req(http.MethodPost, instances[1].URL+"/orders", key, []byte(`{"key":"`+key+`"}`), "Host", "api.test")
		}, lease+3*time.Second)
		if kind, _ := classify(r); kind != kindReplay || !bytes.Equal(r.Body, o.res.Body) {
			v.add("retry of key %s settled after the last restart: got %s, want the replay of %q", key, r, o.res.Body)
		}
		replayed++
	}
	v.report(t)
	t.Logf("Redis killed twice under load (outages %v and %v): %d keys, %d settled, answers: %s; upstream runs %d; service resumed after each restart in %v; %d keys settled after the last restart replayed",
		outages[0].restarted.Sub(outages[0].killed).Round(time.Millisecond), outages[1].restarted.Sub(outages[1].killed).Round(time.Millisecond),
		len(firstAt), len(settled), &counts, len(keys), recovery, replayed)
	if counts.get(kindUnavailable) == 0 {
		t.Errorf("no 503 while Redis was down: the outage was not exercised")
	}
}

// An upstream that runs 4s, four times lock_timeout, on one of two Caddy
// instances, while duplicates arrive on both throughout: the lease is
// renewed, so the duplicates get 409 (on_conflict reject) or wait for the
// replay (on_conflict wait), and the upstream runs once.
func TestFaultLongUpstream(t *testing.T) {
	t.Parallel()
	const (
		lease = time.Second
		long  = 4 * time.Second
	)
	rd := testredis.Start(t)
	u := startUpstream(t)
	site := fmt.Sprintf(`route /wait/* {
	idempotency {
		%[1]s
		lock_timeout 1s
		on_conflict wait 10s
	}
	reverse_proxy %[2]s
}
route {
	idempotency {
		%[1]s
		lock_timeout 1s
	}
	reverse_proxy %[2]s
}`, redisStore(rd), u.host())
	instances := []*caddyProc{startCaddy(t, "A", site), startCaddy(t, "B", site)}
	cl := newClient(t)
	mk := func(c *caddyProc, path, key string) *http.Request {
		return req(http.MethodPost, c.URL+path, key, []byte(`{"amount":7}`), hdrDelay, long.String(), "Host", "api.test")
	}

	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		const key = "long-reject"
		type answer struct {
			res response
			err error
		}
		owner := make(chan answer, 1)
		go func() {
			r, err := do(cl, mk(instances[0], "/orders", key))
			owner <- answer{r, err}
		}()
		select {
		case <-u.startedCh(key):
		case <-time.After(15 * time.Second):
			t.Fatal("the request did not reach the upstream")
		}
		started := time.Now()
		var first answer
		var lastConflict time.Duration
		conflicts, replays := 0, 0
		var replayed []response
		for i, done := 0, false; ; i++ {
			select {
			case first = <-owner:
				done = true
			default:
			}
			if done {
				break
			}
			c := instances[i%2]
			r, err := do(cl, mk(c, "/orders", key))
			if err != nil {
				t.Fatalf("duplicate %d to %s: %v", i, c.name, err)
			}
			switch kind, cerr := classify2(r); {
			case cerr != nil:
				t.Fatalf("duplicate %d to %s: %v", i, c.name, cerr)
			case kind == kindConflict:
				conflicts++
				lastConflict = time.Since(started)
			case kind == kindReplay:
				replays++
				replayed = append(replayed, r)
			default:
				t.Fatalf("duplicate %d to %s, %v after the upstream started: got %s, want 409 or a replay", i, c.name, time.Since(started), r)
			}
			time.Sleep(100 * time.Millisecond)
			if time.Since(started) > long+15*time.Second {
				t.Fatal("the owner never answered")
			}
		}
		if first.err != nil {
			t.Fatalf("the first request: %v", first.err)
		}
		wantStatus(t, "the first request", first.res, http.StatusCreated)
		if first.res.replayed() {
			t.Fatalf("the first request was replayed: %s", first.res)
		}
		if lastConflict < 3*lease {
			t.Fatalf("the last 409 came %v after the upstream started; want duplicates refused past 3 x lock_timeout", lastConflict)
		}
		for _, r := range replayed {
			wantReplay(t, "duplicate answered after the upstream finished", first.res, r)
		}
		// Then replays on both instances, and nothing locked.
		for i, c := range instances {
			r, _ := retryUntilSettled(t, cl, func() *http.Request { return mk(c, "/orders", key) }, lease+2*time.Second)
			wantReplay(t, fmt.Sprintf("retry %d on %s after the answer", i, c.name), first.res, r)
		}
		wantCount(t, "upstream runs", u.starts(key), 1)
		t.Logf("on_conflict reject, upstream %v, lock_timeout %v: %d x 409 on both instances up to %v after the upstream started, %d replays, 1 execution",
			long, lease, conflicts, lastConflict.Round(time.Millisecond), replays+len(instances))
	})

	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		const key = "long-wait"
		const dups = 8
		results := make([]response, dups+1)
		errs := make([]error, dups+1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[0], errs[0] = do(cl, mk(instances[0], "/wait/orders", key))
		}()
		select {
		case <-u.startedCh(key):
		case <-time.After(15 * time.Second):
			t.Fatal("the request did not reach the upstream")
		}
		started := time.Now()
		for i := 1; i <= dups; i++ {
			// Duplicates arrive every half second, alternating instances.
			time.Sleep(time.Until(started.Add(time.Duration(i) * long / (dups + 1))))
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = do(cl, mk(instances[i%2], "/wait/orders", key))
			}()
		}
		if !waitGroupWithin(&wg, long+20*time.Second) {
			t.Fatal("the requests were not answered")
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		wantStatus(t, "the first request", results[0], http.StatusCreated)
		if results[0].replayed() {
			t.Fatalf("the first request was replayed: %s", results[0])
		}
		for i := 1; i <= dups; i++ {
			wantReplay(t, fmt.Sprintf("waiting duplicate %d on %s", i, instances[i%2].name), results[0], results[i])
		}
		wantCount(t, "upstream runs", u.starts(key), 1)
		t.Logf("on_conflict wait, upstream %v, lock_timeout %v: %d duplicates that arrived during the run all got the replay, 1 execution", long, lease, dups)
	})
}

// classify2 is classify for the answers of upstream_test.go's upstream,
// which sends JSON: it tells 409 problems and replays apart and checks
// their form.
func classify2(r response) (string, error) {
	switch {
	case r.Status == http.StatusConflict:
		if problemAnchor(r) != "outstanding" {
			return kindOther, fmt.Errorf("409 that is not the outstanding problem: %s", r)
		}
		return kindConflict, checkProblem(r, "outstanding", true)
	case r.Status == http.StatusCreated && r.replayed() && r.Header.Get("Content-Type") == "application/json":
		return kindReplay, nil
	case r.Status == http.StatusCreated && r.Header.Get("Content-Type") == "application/json":
		return kindNew, nil
	}
	return kindOther, fmt.Errorf("unexpected answer %s", r)
}

// Clients that give up at random points, before the status line, in the
// middle of the streamed body or after it, while 16 of them run at once
// against two instances: every upstream run completes (the disconnect does
// not cancel the work), no key runs twice, and for every completed run a
// retry replays exactly what the upstream sent.
func TestFaultClientDisconnects(t *testing.T) {
	t.Parallel()
	const (
		keys        = 200
		concurrency = 16
		lease       = 3 * time.Second
	)
	rd := testredis.Start(t)
	u := startFaultUpstream(t)
	options := redisStore(rd) + "\nlock_timeout 3s"
	instances := []*caddyProc{
		startCaddy(t, "A", faultSite(u, "A", options, 5*time.Second)),
		startCaddy(t, "B", faultSite(u, "B", options, 5*time.Second)),
	}
	cl := newClient(t)
	var (
		v        violations
		counts   tally
		outcomes = make([]outcome, keys)
	)
	keyName := func(i int) string { return fmt.Sprintf("disconnect-%03d", i) }
	mk := func(i int, c *caddyProc, rng *rand.Rand) *http.Request {
		key := keyName(i)
		hdr := []string{"Host", "api.test"}
		if rng != nil {
			hdr = append(hdr,
				fHdrLatency, ms(randDuration(rng, 50*time.Millisecond, 200*time.Millisecond)),
				fHdrChunks, "3",
				fHdrGap, ms(randDuration(rng, 20*time.Millisecond, 60*time.Millisecond)))
		}
		return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"key":"`+key+`"}`), hdr...)
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := range jobs {
				cancelAfter := time.Duration(-1)
				if rng.IntN(5) > 0 { // 4 in 5 give up at a random moment
					cancelAfter = randDuration(rng, 0, 300*time.Millisecond)
				}
				o := fetch(cl, mk(i, instances[i%2], rng), cancelAfter)
				outcomes[i] = o
				switch {
				case o.err != nil:
					v.add("key %s: transport error %v", keyName(i), o.err)
				case o.cancelled:
					counts.add("gave up "+o.phase, 1)
				default:
					counts.add("read whole answer", 1)
					if kind, err := classify(o.res); err != nil || kind != kindNew {
						v.add("key %s: first answer %s (%s, %v), want the upstream's 201", keyName(i), o.res, kind, err)
					}
				}
			}
		}()
	}
	for i := range keys {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	load := time.Since(begin)
	if !u.quiesce(15 * time.Second) {
		v.add("the upstream still serves %d requests 15s after the clients left", u.inflight.Load())
	}
	for _, c := range instances {
		c.wantAlive("after clients disconnected")
	}

	// Check every key, 16 at a time, retrying on the instance the first
	// request did not use.
	var completed, neverRan, replays atomic.Int32
	check := func(i int) {
		key := keyName(i)
		runs := u.runs(key)
		switch {
		case len(runs) > 1:
			v.add("key %s ran %d times", key, len(runs))
			return
		case len(runs) == 1 && !runs[0].Completed:
			v.add("key %s: the upstream run did not complete (cancelled %t) after the client gave up %s", key, runs[0].Cancelled, outcomes[i].phase)
			return
		}
		other := instances[(i+1)%2]
		deadline := time.Now().Add(lease + 2*time.Second)
		var r response
		var kind string
		for {
			o := fetch(cl, mk(i, other, nil), -1)
			if o.err != nil {
				v.add("key %s: retry: %v", key, o.err)
				return
			}
			var err error
			r = o.res
			kind, err = classify(r)
			if err != nil {
				v.add("key %s: retry: %v", key, err)
				return
			}
			if kind != kindConflict {
				break
			}
			if time.Now().After(deadline) {
				v.add("key %s: still 409 %v after its upstream run ended (lock_timeout %v)", key, lease+2*time.Second, lease)
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
		if len(runs) == 0 {
			// The client left before the request reached the upstream:
			// nothing ran, so the retry runs it.
			neverRan.Add(1)
			if kind != kindNew || len(u.runs(key)) != 1 {
				v.add("key %s never reached the upstream; its retry got %s (%s, %d runs), want a first execution", key, r, kind, len(u.runs(key)))
			}
			return
		}
		completed.Add(1)
		if kind != kindReplay || runOf(r) != 1 || !bytes.Equal(r.Body, runs[0].Body) {
			v.add("key %s (client gave up %s): retry got %s, want the replay of the %d bytes the upstream sent", key, outcomes[i].phase, r, len(runs[0].Body))
			return
		}
		replays.Add(1)
		if o := outcomes[i]; o.phase == phaseComplete && !bytes.Equal(o.res.Body, r.Body) {
			v.add("key %s: the first client got %q, the replay is %q", key, o.res.Body, r.Body)
		}
		if n := len(u.runs(key)); n != 1 {
			v.add("key %s ran %d times after the retry", key, n)
		}
	}
	idx := make(chan int)
	var cwg sync.WaitGroup
	for range concurrency {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for i := range idx {
				check(i)
			}
		}()
	}
	for i := range keys {
		idx <- i
	}
	close(idx)
	cwg.Wait()
	v.report(t)
	t.Logf("%d keys, %d clients at once, load %v: %s; %d upstream runs completed, all replayed byte for byte (%d replays); %d keys never reached the upstream and ran on retry; 0 cancelled runs, 0 keys run twice",
		keys, concurrency, load.Round(time.Millisecond), &counts, completed.Load(), replays.Load(), neverRan.Load())
	if counts.get("gave up "+phaseMidBody) == 0 || counts.get("gave up "+phaseBeforeHeaders) == 0 {
		t.Logf("warning: not every disconnect point was exercised: %s", &counts)
	}
}

// waitGroupWithin waits for wg at most d and reports whether it finished.
func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// A client leaves while the upstream hangs. The README: "the work gets one
// more lock_timeout after the client left; if it has not answered by then
// it is cancelled and the claim released", so the retry runs the request
// again.
func TestFaultHungUpstreamAfterClientLeft(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, storeOptions+"\nlock_timeout 1s"))
		cl := newClient(t)
		const key = "hung-1"
		mk := func() *http.Request {
			// The first run hangs for 20s; a second one answers at once.
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), hdrDelay, "20s,0")
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := do(cl, mk().WithContext(ctx))
			errc <- err
		}()
		select {
		case <-u.startedCh(key):
		case <-time.After(15 * time.Second):
			t.Fatal("the request did not reach the upstream")
		}
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("the client got an answer although the upstream hangs")
		}
		left := time.Now()
		if !eventually(10*time.Second, 10*time.Millisecond, func() bool { return u.cancelled(key) == 1 }) {
			t.Fatal("the hung upstream was not cancelled within 10s of the client leaving")
		}
		t.Logf("the hung upstream was cancelled %v after the client left (lock_timeout 1s)", time.Since(left).Round(time.Millisecond))
		retry, conflicts := retryUntilSettled(t, cl, mk, 5*time.Second)
		if retry.Status != http.StatusCreated || retry.replayed() || retry.Header.Get(hdrRun) != "2" {
			t.Fatalf("retry after the hung upstream was cancelled (after %d x 409): got %s; want the request run again (201, run 2)", conflicts, retry)
		}
		wantCount(t, "upstream runs", u.starts(key), 2)
	})
}

// The README: lock_timeout "must exceed the longest stall of one instance
// (a GC pause, a network partition from the store) that you want to
// survive without a second execution". Here Redis (persistent, so the
// claim survives) is down for 1.2s, 40% of a 3s lock_timeout, while the
// owner runs an 8s request: the owner's claim must survive, and a
// duplicate sent after Redis is back must get 409, not run the request a
// second time alongside the first.
func TestFaultLeaseSurvivesShortRedisOutage(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	rd := startDurableRedis(t)
	u := startUpstream(t)
	site := proxySite(u, fmt.Sprintf("store redis {\n\taddress %s\n}\nlock_timeout %v", rd.Addr(), lease))
	a, b := startCaddy(t, "A", site), startCaddy(t, "B", site)
	cl := newClient(t)
	const key = "outage-1"
	mk := func(c *caddyProc) *http.Request {
		// The first run takes 8s; a second one, if any, answers at once.
		return req(http.MethodPost, c.URL+"/payments", key, []byte(`{"amount":5}`), hdrDelay, "8s,0", "Host", "api.test")
	}
	go func() { _, _ = do(cl, mk(a)) }()
	select {
	case <-u.startedCh(key):
	case <-time.After(15 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	started := time.Now()
	// The owner renews every lease/3, from when it claimed the key: at
	// about 1s, 2s, 3s. The outage covers the first two renewals.
	time.Sleep(time.Until(started.Add(900 * time.Millisecond)))
	rd.Kill()
	killed := time.Now()
	time.Sleep(time.Until(started.Add(2 * time.Second)))
	rd.Restart(t)
	restarted := time.Now()
	t.Logf("Redis down from %v to %v after the upstream started (%v, lock_timeout %v)",
		killed.Sub(started).Round(time.Millisecond), restarted.Sub(started).Round(time.Millisecond),
		restarted.Sub(killed).Round(time.Millisecond), lease)
	if restarted.Sub(killed) > 2*lease/3 {
		t.Fatalf("the outage lasted %v, over two thirds of the lease: the machine is too slow for this test", restarted.Sub(killed))
	}
	time.Sleep(time.Until(started.Add(3500 * time.Millisecond)))
	sent := time.Now()
	res, err := do(cl, mk(b))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != http.StatusConflict {
		lost := strings.Contains(a.Log(), "claim lost while the request runs")
		t.Fatalf("duplicate on B %v after the upstream started, while A still runs the request: got %s (upstream runs %d; A logged \"claim lost while the request runs\": %t); want 409: a %v store outage lost a %v lease",
			sent.Sub(started).Round(time.Millisecond), res, u.starts(key), lost, restarted.Sub(killed).Round(time.Millisecond), lease)
	}
	wantProblem(t, "duplicate while A runs the request", res, http.StatusConflict, "outstanding", true)
	wantCount(t, "upstream runs", u.starts(key), 1)
}
