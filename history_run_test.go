package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Playing a history: each instance is a Caddy handler in front of Caddy's
// own reverse_proxy, served over HTTP on loopback, to one upstream server
// that does what each request's script says and notes every run. The
// store is a real server (Redis, PostgreSQL) reached through a fault proxy
// per instance, or the file or memory store in the instance. What the
// clients got and what the upstream ran go to the checker.

// clientGiveUp is how long a client waits for an answer: a request may
// wait out a few store calls of a store that does not answer (PostgreSQL's
// are bounded at 5s). A request whose upstream hangs is given up after
// hangGiveUp, as a client that times out.
const (
	clientGiveUp = 20 * time.Second
	hangGiveUp   = 1500 * time.Millisecond
	slowRun      = 1600 * time.Millisecond
)

// plays numbers the plays of the process: a history played again (to
// shrink it) must not find the keys and tables of an earlier play.
var plays atomic.Int64

// histRun is one playing of a history, and what it saw.
type histRun struct {
	h     *history
	t     testing.TB
	start time.Time
	dir   string
	play  string // the prefix of its keys and tables, unique in the process

	redis    *testredis.Server // the redis store's server
	pgDSN    string            // the postgres store's server, direct
	pgTable  string
	upstream *httptest.Server
	next     caddyhttp.Handler // reverse_proxy to upstream

	mu        sync.Mutex
	runs      []*upstreamRun // what the upstream ran, in order of start
	results   []*histResult
	servedBy  map[string]int // request ID: the generation of the process that took it
	faultsAt  []faultWindow  // when each fault really happened
	instances []*histInstance
	logs      []*observer.ObservedLogs
	cleanups  []func()
}

// upstreamRun is one request the upstream received.
type upstreamRun struct {
	id         int
	reqID      string
	key        string
	start, end time.Duration
	body       []byte // what it received
	status     int    // what it answered; 0 for none
	answer     []byte
}

// histResult is what one request of a script got.
type histResult struct {
	key        string
	req        histRequest
	index      int // in its key's script; -1 for the probe
	id         string
	sent, done time.Duration
	status     int
	replayed   bool
	problem    string // the problem's anchor (outstanding, key-reused, ...) when the module refused
	body       []byte
	err        error // no answer came
	sentBody   []byte
	gen        int // of the process that took it
}

// faultWindow is when a fault was in force, and on which instance.
type faultWindow struct {
	f          histFault
	start, end time.Duration
}

// histInstance is one instance: a server whose handler a reload swaps and
// whose process a death replaces.
type histInstance struct {
	index int
	srv   *httptest.Server
	cur   atomic.Pointer[histProcess]
}

// histProcess is one life of an instance: its handler, its link to the
// store, and whether it is dead.
type histProcess struct {
	handler atomic.Pointer[Handler]
	cancel  []func() // cleans up each handler's config
	proxy   *faultproxy.Proxy
	dead    atomic.Bool
	calls   atomic.Int64 // store calls under way
	gen     int
	dir     string // the file store's directory
}

// killable is a store that a dead process can no longer reach. It counts
// the calls under way, so that a file store's files are copied, as the
// dead process left them, once its last call has returned.
type killable struct {
	store.Store
	p        *histProcess
	run      *histRun
	instance int
}

// slowCall is how long a store call may take before the model counts it
// as a fault of its own: a claim whose renewal takes longer than a third
// of its lease may be lost, as its instance then logs. On this shared
// machine a loaded host slows the store as a stalled link would.
const slowCall = histLease / 4

var errDeadProcess = errors.New("the process is dead")

// enter reports whether a call may go on, counting it until leave.
func (k killable) enter() bool {
	k.p.calls.Add(1)
	if k.p.dead.Load() {
		k.p.calls.Add(-1)
		return false
	}
	return true
}

// leave ends a call that began at start, and records it as a fault of
// its instance if it was slow.
func (k killable) leave(start time.Time) {
	k.p.calls.Add(-1)
	if took := time.Since(start); took > slowCall {
		end := k.run.now()
		w := faultWindow{f: histFault{at: end - took, dur: took, kind: faultSlow, instance: k.instance}, start: end - took, end: end}
		k.run.mu.Lock()
		k.run.faultsAt = append(k.run.faultsAt, w)
		k.run.mu.Unlock()
	}
}

func (k killable) Acquire(ctx context.Context, key store.Key, c *store.Claim) (store.Acquired, error) {
	if !k.enter() {
		return store.Acquired{}, store.Unavailable("acquiring", errDeadProcess)
	}
	defer k.leave(time.Now())
	return k.Store.Acquire(ctx, key, c)
}

func (k killable) Complete(ctx context.Context, key store.Key, c *store.Claim, r *store.Response, ttl time.Duration) error {
	if !k.enter() {
		return store.Unavailable("completing", errDeadProcess)
	}
	defer k.leave(time.Now())
	return k.Store.Complete(ctx, key, c, r, ttl)
}

func (k killable) Release(ctx context.Context, key store.Key, tok store.Token) error {
	if !k.enter() {
		// Settled, as far as the handler can tell: a dead process's
		// withdrawals die with it, but in the test's one process they
		// would stay in the process-wide list, and hold back the claims
		// of the process that took its place. The store is not touched.
		return nil
	}
	defer k.leave(time.Now())
	return k.Store.Release(ctx, key, tok)
}

func (k killable) Renew(ctx context.Context, key store.Key, tok store.Token, lease time.Duration) error {
	if !k.enter() {
		return store.Unavailable("renewing", errDeadProcess)
	}
	defer k.leave(time.Now())
	return k.Store.Renew(ctx, key, tok, lease)
}

// play plays h and returns what it saw; the servers it needs of its own it
// starts, the shared PostgreSQL excepted.
func play(t testing.TB, h *history, pgDSN string) (*histRun, error) {
	run := &histRun{h: h, t: t, pgDSN: pgDSN, play: fmt.Sprintf("h%d-p%d", h.seed, plays.Add(1)), servedBy: make(map[string]int)}
	defer run.close()
	var err error
	if run.dir, err = os.MkdirTemp("", "history-"); err != nil {
		return nil, err
	}
	run.cleanups = append(run.cleanups, func() { os.RemoveAll(run.dir) })
	switch h.store {
	case "redis":
		run.redis = testredis.Start(t)
	case "postgres":
		run.pgTable = strings.ReplaceAll(run.play, "-", "_")
	}
	run.upstream = httptest.NewServer(http.HandlerFunc(run.serveUpstream))
	run.cleanups = append(run.cleanups, run.upstream.Close)
	if run.next, err = run.reverseProxy(); err != nil {
		return nil, err
	}
	for i := range h.instances {
		in := &histInstance{index: i}
		in.srv = httptest.NewServer(http.HandlerFunc(in.serve(run)))
		run.cleanups = append(run.cleanups, in.srv.Close)
		p, err := run.startProcess(i, 0, "")
		if err != nil {
			return nil, err
		}
		in.cur.Store(p)
		run.instances = append(run.instances, in)
	}

	run.start = time.Now()
	var wg sync.WaitGroup
	for _, f := range h.faults {
		wg.Go(func() { run.fault(f) })
	}
	for _, k := range h.keys {
		for i, q := range k.reqs {
			wg.Go(func() {
				time.Sleep(time.Until(run.start.Add(q.at)))
				run.send(run.play+"-"+k.name, q, i)
			})
		}
	}
	wg.Wait()
	// Quiet: every lease and every hung upstream's work has run out.
	time.Sleep(histLease + hangGiveUp + 500*time.Millisecond)
	for _, k := range h.keys {
		probe := k.reqs[0]
		probe.behaviour, probe.instance = upFast, 0
		run.send(run.play+"-"+k.name, probe, -1)
	}
	return run, nil
}

func (run *histRun) now() time.Duration { return time.Since(run.start) }

func (run *histRun) close() {
	for i := len(run.cleanups) - 1; i >= 0; i-- {
		run.cleanups[i]()
	}
}

// caddyGlobals serialises the provisioning of Caddy's reverse_proxy:
// provisionContext and the proxy's metrics write package variables, which
// Caddy itself only writes under its config lock, and histories play in
// parallel.
var caddyGlobals sync.Mutex

// reverseProxy provisions Caddy's reverse_proxy to the upstream.
func (run *histRun) reverseProxy() (caddyhttp.Handler, error) {
	caddyGlobals.Lock()
	defer caddyGlobals.Unlock()
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := caddy.NewContext(base)
	run.cleanups = append(run.cleanups, cancel)
	rp := &reverseproxy.Handler{TransportRaw: json.RawMessage(`{"protocol":"http"}`),
		Upstreams: reverseproxy.UpstreamPool{{Dial: run.upstream.Listener.Addr().String()}}}
	if err := rp.Provision(ctx); err != nil {
		return nil, err
	}
	end := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return rp.ServeHTTP(w, r, end) }), nil
}

// storeRaw is the store block of instance's process of generation gen;
// changed is a reload's other block.
func (run *histRun) storeRaw(p *histProcess, instance int, changed bool) json.RawMessage {
	switch run.h.store {
	case "memory":
		// A process's memory dies with it: each generation has its table.
		raw := fmt.Sprintf(`{"module":"memory","name":"%s-i%d-g%d"`, run.play, instance, p.gen)
		if changed {
			raw += `,"max_entries":50000`
		}
		return json.RawMessage(raw + "}")
	case "file":
		path, _ := json.Marshal(p.dir)
		raw := `{"module":"file","path":` + string(path)
		if changed {
			raw += `,"name":"hist file"`
		}
		return json.RawMessage(raw + "}")
	case "redis":
		pool := 8
		if changed {
			pool = 9
		}
		return json.RawMessage(fmt.Sprintf(`{"module":"redis","addresses":[%q],"pool_size":%d,"read_timeout":"500ms","write_timeout":"500ms","dial_timeout":"500ms"}`,
			p.proxy.Addr(), pool))
	}
	dsn := strings.Replace(run.pgDSN, "@"+hostOf(run.pgDSN)+"/", "@"+p.proxy.Addr()+"/", 1)
	conns := 6
	if changed {
		conns = 7
	}
	return json.RawMessage(fmt.Sprintf(`{"module":"postgres","dsn":%q,"table":%q,"max_conns":%d}`, dsn, run.pgTable, conns))
}

// hostOf is the host:port of a postgres://user@host:port/db DSN.
func hostOf(dsn string) string {
	_, rest, _ := strings.Cut(dsn, "@")
	host, _, _ := strings.Cut(rest, "/")
	return host
}

// startProcess starts instance's process of generation gen, on the file
// store's directory dir (a dead process's, copied) or a new one.
func (run *histRun) startProcess(instance, gen int, dir string) (*histProcess, error) {
	p := &histProcess{gen: gen, dir: dir}
	if p.dir == "" {
		p.dir = filepath.Join(run.dir, fmt.Sprintf("i%d-g%d", instance, gen))
	}
	switch run.h.store {
	case "redis", "postgres":
		target := ""
		if run.redis != nil {
			target = run.redis.Addr()
		} else {
			target = hostOf(run.pgDSN)
		}
		proxy, err := faultproxy.New(target)
		if err != nil {
			return nil, err
		}
		p.proxy = proxy
		run.mu.Lock()
		run.cleanups = append(run.cleanups, func() { proxy.Close() })
		run.mu.Unlock()
	}
	h, cancel, err := run.provision(p, instance, false)
	if err != nil {
		return nil, err
	}
	p.cancel = append(p.cancel, cancel)
	p.handler.Store(h)
	// Every process's configs end with the history, a dead one's too (it
	// runs on, unheard, until then): else its pools and files stay open.
	run.mu.Lock()
	run.cleanups = append(run.cleanups, func() {
		for _, c := range p.cancel {
			c()
		}
	})
	run.mu.Unlock()
	return p, nil
}

// provision makes a handler of the route on p's store.
func (run *histRun) provision(p *histProcess, instance int, changed bool) (*Handler, func(), error) {
	r := run.h.route
	h := &Handler{Options: app.Options{
		StoreRaw:        run.storeRaw(p, instance, changed),
		LockTimeout:     caddy.Duration(histLease),
		TTL:             caddy.Duration(r.ttl),
		Fingerprint:     r.fingerprint,
		DisableMetrics:  true,
		ReplayHeader:    "Idempotent-Replayed",
		MaxResponseBody: 1 << 20,
	}}
	if r.wait > 0 {
		h.OnConflict, h.MaxWait = app.ConflictWait, caddy.Duration(r.wait)
	}
	if r.keep {
		h.OnUnknownOutcome = app.UnknownKeep
	}
	if r.failOpen {
		h.OnStoreError = app.FailOpen
	}
	if r.release409 {
		h.ReleaseStatuses = []int{http.StatusConflict}
	}
	if r.keyInBody {
		h.KeyFrom = &app.KeyFrom{JSON: "/id"}
	}
	if r.sealed {
		h.EncryptionKeys = []string{"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE="}
	}
	if r.smallMax {
		h.MaxResponseBody = 512
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := h.Provision(ctx); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("provisioning instance %d: %w", instance, err)
	}
	if err := h.Validate(); err != nil {
		cancel()
		return nil, nil, err
	}
	logs := watchLogs(h)
	h.store = killable{Store: h.store, p: p, run: run, instance: instance}
	h.leases.store = h.store
	run.mu.Lock()
	run.logs = append(run.logs, logs)
	run.mu.Unlock()
	return h, sync.OnceFunc(cancel), nil // a reload ends the old config before the history does
}

// serve is instance in's HTTP server: its current process's handler, as
// Caddy's server runs it, in front of reverse_proxy.
func (in *histInstance) serve(run *histRun) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		p := in.cur.Load()
		run.mu.Lock()
		run.servedBy[r.Header.Get("X-Request-Id")] = p.gen
		run.mu.Unlock()
		if p.dead.Load() {
			panic(http.ErrAbortHandler) // a dead process answers nothing
		}
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
		if err := p.handler.Load().ServeHTTP(w, r, run.next); err != nil {
			status := http.StatusInternalServerError
			var herr caddyhttp.HandlerError
			if errors.As(err, &herr) {
				status = herr.StatusCode
			}
			w.WriteHeader(status)
		}
	}
}

// serveUpstream does what the request's script says, and notes the run.
func (run *histRun) serveUpstream(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	run.mu.Lock()
	u := &upstreamRun{id: len(run.runs) + 1, reqID: r.Header.Get("X-Request-Id"), key: r.Header.Get("X-Hist-Key"),
		start: run.now(), body: body}
	run.runs = append(run.runs, u)
	run.mu.Unlock()
	defer func() {
		run.mu.Lock()
		u.end = run.now()
		run.mu.Unlock()
	}()
	b, _ := strconv.Atoi(r.Header.Get("X-Behaviour"))
	answer := []byte(fmt.Sprintf(`{"run":%d,"req":%q}`, u.id, u.reqID))
	status := http.StatusCreated
	switch behaviour(b) {
	case upSlow:
		time.Sleep(slowRun)
	case upClientError:
		status = http.StatusBadRequest
	case upConflict:
		status = http.StatusConflict
	case upServerError:
		status = http.StatusServiceUnavailable
	case upSlowError:
		time.Sleep(slowRun)
		status = http.StatusServiceUnavailable
	case upTooMany:
		status = http.StatusTooManyRequests
	case upPanic:
		panic(http.ErrAbortHandler) // the connection drops, no answer
	case upHang:
		<-r.Context().Done()
		return
	case upLarge:
		answer = append(answer, bytes.Repeat([]byte(" "), 2048)...)
	case upNoContent:
		status, answer = http.StatusNoContent, nil
	}
	run.mu.Lock()
	u.status, u.answer = status, answer
	run.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(answer)
}

// bodyOf is the body of key's request in variant v: 0 and 1 spell one
// JSON payload two ways, 2 is another payload.
func bodyOf(key string, v int, keyInBody bool) []byte {
	id := ""
	if keyInBody {
		id = fmt.Sprintf(`"id":%q,`, key)
	}
	switch v {
	case 0:
		return []byte(fmt.Sprintf(`{%s"amount":100,"n":%q}`, id, key))
	case 1:
		return []byte(fmt.Sprintf(`{ "n": %q, %s"amount": 100.0 }`, key, id))
	}
	return []byte(fmt.Sprintf(`{%s"amount":999,"n":%q}`, id, key))
}

// send sends the request q of key's script (index i; -1 is the probe).
func (run *histRun) send(key string, q histRequest, i int) {
	res := &histResult{key: key, req: q, index: i, id: fmt.Sprintf("%s-%d", key, i),
		sentBody: bodyOf(key, q.body, run.h.route.keyInBody)}
	in := run.instances[q.instance]
	req, _ := http.NewRequest(http.MethodPost, in.srv.URL+q.path, bytes.NewReader(res.sentBody))
	if !run.h.route.keyInBody {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", res.id)
	req.Header.Set("X-Hist-Key", key)
	req.Header.Set("X-Behaviour", strconv.Itoa(int(q.behaviour)))
	giveUp := clientGiveUp
	if q.behaviour == upHang {
		giveUp = hangGiveUp
	}
	client := &http.Client{Timeout: giveUp, Transport: &http.Transport{DisableKeepAlives: true}}
	res.sent = run.now()
	if dump := os.Getenv("HISTORY_DUMP"); dump != "" && giveUp == clientGiveUp {
		t := time.AfterFunc(giveUp-time.Second, func() {
			buf := make([]byte, 64<<20)
			os.WriteFile(fmt.Sprintf("%s/%s.stacks", dump, res.id), buf[:runtime.Stack(buf, true)], 0o644)
		})
		defer t.Stop()
	}
	resp, err := client.Do(req)
	if err == nil {
		res.body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		res.status = resp.StatusCode
		res.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			var p struct{ Type string }
			json.Unmarshal(res.body, &p)
			_, res.problem, _ = strings.Cut(p.Type, "#")
		}
	}
	res.err = err
	res.done = run.now()
	run.mu.Lock()
	run.results = append(run.results, res)
	run.mu.Unlock()
}

// fault applies f at its time, and notes when it was in force.
func (run *histRun) fault(f histFault) {
	time.Sleep(time.Until(run.start.Add(f.at)))
	w := faultWindow{f: f, start: run.now()}
	in := run.instances[f.instance]
	p := in.cur.Load()
	switch f.kind {
	case faultStall:
		p.proxy.Blackhole(true)
		time.Sleep(f.dur)
		p.proxy.Cut()
		p.proxy.Heal()
	case faultCut:
		p.proxy.Cut()
	case faultFull:
		run.fillRedis()
		time.Sleep(f.dur)
		run.emptyRedis()
	case faultReload:
		h, cancel, err := run.provision(p, f.instance, f.changed)
		if err != nil {
			run.t.Errorf("reloading: %v", err)
			break
		}
		p.handler.Store(h)
		run.mu.Lock()
		oldCancel := p.cancel[len(p.cancel)-1]
		p.cancel = append(p.cancel, cancel)
		run.mu.Unlock()
		// Caddy cleans up the old config once the new one serves.
		time.Sleep(50 * time.Millisecond)
		oldCancel()
	case faultDeath:
		p.dead.Store(true)
		in.srv.CloseClientConnections()
		if p.proxy != nil {
			p.proxy.Blackhole(true)
			p.proxy.Cut()
		}
		dir := ""
		if run.h.store == "file" {
			// What the dead process left on disk, once its last store call
			// has returned; it runs on, unheard.
			for deadline := time.Now().Add(10 * time.Second); p.calls.Load() > 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			dir = filepath.Join(run.dir, fmt.Sprintf("i%d-g%d", f.instance, p.gen+1))
			if err := copyDir(p.dir, dir); err != nil {
				run.t.Errorf("copying the dead process's files: %v", err)
			}
		}
		next, err := run.startProcess(f.instance, p.gen+1, dir)
		if err != nil {
			run.t.Errorf("restarting instance %d: %v", f.instance, err)
			return
		}
		in.cur.Store(next)
		w.end = run.now() // the process that took its place serves
		run.mu.Lock()
		run.faultsAt = append(run.faultsAt, w)
		run.mu.Unlock()
		return
	}
	w.end = run.now()
	run.mu.Lock()
	run.faultsAt = append(run.faultsAt, w)
	run.mu.Unlock()
}

// copyDir copies the files the dead process left, as a crash would leave
// them: the process runs on, and its background work (the sweep, the
// journal's compaction) may commit while the files are read, which would
// tear the copy (bbolt reuses the pages a later commit frees). So the files
// are read until two reads in a row agree: no commit fell between them.
func copyDir(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	files, err := readDir(from)
	for tries := 0; err == nil; tries++ {
		var again map[string][]byte
		if again, err = readDir(from); err != nil {
			break
		}
		if maps.EqualFunc(files, again, bytes.Equal) {
			break
		}
		if tries == 100 {
			return fmt.Errorf("the files of %s kept changing while read", from)
		}
		files = again
	}
	if err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(to, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// readDir reads every file of dir.
func readDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := make(map[string][]byte, len(entries))
	for _, e := range entries {
		if files[e.Name()], err = os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// fillRedis fills the redis store's server until it refuses writes, with
// noeviction, the policy the docs advise.
func (run *histRun) fillRedis() {
	c := run.redis.Client()
	ctx := context.Background()
	used, _ := c.Info(ctx, "memory").Result()
	n := int64(0)
	for _, line := range strings.Split(used, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	c.ConfigSet(ctx, "maxmemory-policy", "noeviction")
	c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(n+(2<<20), 10))
	junk := bytes.Repeat([]byte("j"), 32<<10)
	for i := 0; i < 1000; i++ {
		if err := c.Set(ctx, fmt.Sprintf("junk:%d", i), junk, 0).Err(); err != nil {
			return // full
		}
	}
}

func (run *histRun) emptyRedis() {
	c := run.redis.Client()
	ctx := context.Background()
	iter := c.Scan(ctx, 0, "junk:*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
	c.ConfigSet(ctx, "maxmemory", "0")
}
