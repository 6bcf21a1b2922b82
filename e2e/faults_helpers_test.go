package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// Helpers of the fault-injection suite (faults_test.go) and the soak test
// (soak_test.go): an upstream that records every run of every key with the
// exact bytes it sent, a client that gives up at a chosen moment, a
// classifier of the answers a client may get, and collectors that never
// call t.Fatal, so that they are safe in any goroutine.

// Request headers that tell the fault upstream how to answer, and the
// headers it answers with. Lists separated by commas are indexed by the run
// number of the key, as with the headers of upstream_test.go.
const (
	fHdrLatency  = "X-Fault-Latency"  // durations: wait before the status line
	fHdrStatus   = "X-Fault-Status"   // status codes; default 201
	fHdrChunks   = "X-Fault-Chunks"   // flushed body chunks; default 1
	fHdrGap      = "X-Fault-Gap"      // pause between two chunks; default none
	fHdrInstance = "X-Fault-Instance" // set by Caddy (header_up): the Caddy that proxied the run
	fHdrRun      = "X-Fault-Run"      // response: the run number of the key
	fContentType = "text/plain; charset=utf-8"
	fMaxWait     = 30 * time.Second // no fault upstream request waits longer
)

// fRun is one execution of a key at the fault upstream.
type fRun struct {
	N         int
	Instance  string // the header_up value of the Caddy that proxied it
	Start     time.Time
	End       time.Time
	Status    int
	Body      []byte // what was written, whole or not
	Ended     bool
	Answered  bool // the status line was written
	Completed bool // the whole answer was written while the request was alive
	Cancelled bool // the request's context ended (or the upstream closed) first
}

// faultUpstream is the application behind reverse_proxy in the fault tests.
// Every answer is random text, so a replay can be compared byte for byte
// with what the upstream sent on the run the replay names.
type faultUpstream struct {
	srv     *httptest.Server
	closing chan struct{}

	inflight atomic.Int64
	mu       sync.Mutex
	keys     map[string][]*fRun
}

func startFaultUpstream(t testing.TB) *faultUpstream {
	t.Helper()
	u := &faultUpstream{closing: make(chan struct{}), keys: make(map[string][]*fRun)}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		close(u.closing)
		u.srv.Close()
	})
	return u
}

func (u *faultUpstream) host() string { return strings.TrimPrefix(u.srv.URL, "http://") }

func (u *faultUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.inflight.Add(1)
	defer u.inflight.Add(-1)
	key := r.Header.Get("Idempotency-Key")
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	run := &fRun{N: len(u.keys[key]) + 1, Instance: r.Header.Get(fHdrInstance), Start: time.Now()}
	u.keys[key] = append(u.keys[key], run)
	u.mu.Unlock()

	var sent []byte
	end := func(completed bool) {
		u.mu.Lock()
		run.End, run.Body, run.Ended = time.Now(), sent, true
		run.Completed, run.Cancelled = completed, !completed
		u.mu.Unlock()
	}
	status := http.StatusCreated
	if v := pick(r.Header.Get(fHdrStatus), run.N); v != "" {
		status, _ = strconv.Atoi(v)
	}
	u.mu.Lock()
	run.Status = status
	u.mu.Unlock()
	if !u.sleep(r, pick(r.Header.Get(fHdrLatency), run.N)) {
		end(false)
		return
	}
	chunks := 1
	if v := r.Header.Get(fHdrChunks); v != "" {
		chunks, _ = strconv.Atoi(v)
	}
	h := w.Header()
	h.Set("Content-Type", fContentType)
	h.Set(fHdrRun, strconv.Itoa(run.N))
	w.WriteHeader(status)
	u.mu.Lock()
	run.Answered = true
	u.mu.Unlock()
	rc := http.NewResponseController(w)
	for i := range chunks {
		if i > 0 && !u.sleep(r, r.Header.Get(fHdrGap)) {
			end(false)
			return
		}
		c := randomText(64 + rand.IntN(2000))
		if _, err := w.Write(c); err != nil {
			end(false)
			return
		}
		_ = rc.Flush()
		sent = append(sent, c...)
	}
	end(r.Context().Err() == nil)
}

// sleep waits for d (a duration string, "" for none) and reports false if
// the request ended meanwhile.
func (u *faultUpstream) sleep(r *http.Request, d string) bool {
	if d == "" {
		return r.Context().Err() == nil
	}
	dur, err := time.ParseDuration(d)
	if err != nil {
		panic(fmt.Sprintf("bad fault duration %q", d))
	}
	t := time.NewTimer(min(dur, fMaxWait))
	defer t.Stop()
	select {
	case <-t.C:
		return r.Context().Err() == nil
	case <-r.Context().Done():
	case <-u.closing:
	}
	return false
}

// runs returns a copy of the runs of key.
func (u *faultUpstream) runs(key string) []fRun {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]fRun, len(u.keys[key]))
	for i, r := range u.keys[key] {
		out[i] = *r
	}
	return out
}

func (u *faultUpstream) allKeys() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	keys := make([]string, 0, len(u.keys))
	for k := range u.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// quiesce waits until no request is being served, and reports whether that
// happened within timeout.
func (u *faultUpstream) quiesce(timeout time.Duration) bool {
	return eventually(timeout, 10*time.Millisecond, func() bool { return u.inflight.Load() == 0 })
}

const textAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomText(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = textAlphabet[rand.IntN(len(textAlphabet))]
	}
	b[n-1] = '\n'
	return b
}

// faultSite is a site with two idempotent routes in front of u: /wait/*
// with on_conflict wait (maxWait), every other path with on_conflict
// reject. options go into both idempotency blocks; instance is sent to the
// upstream with every request, so that each run names its Caddy.
func faultSite(u *faultUpstream, instance, options string, maxWait time.Duration) string {
	return fmt.Sprintf(`route /wait/* {
	idempotency {
%[1]s
		on_conflict wait %[4]s
	}
	reverse_proxy %[2]s {
		header_up %[5]s %[3]s
	}
}
route {
	idempotency {
%[1]s
	}
	reverse_proxy %[2]s {
		header_up %[5]s %[3]s
	}
}`, options, u.host(), instance, maxWait, fHdrInstance)
}

// Where a request that the client cancelled ended.
const (
	phaseComplete      = "complete"       // the whole answer was read
	phaseBeforeHeaders = "before-headers" // no status line
	phaseMidBody       = "mid-body"       // the status line, part of the body
)

// outcome is what a client saw of one request.
type outcome struct {
	res       response
	phase     string
	err       error // a transport error the client did not cause; nil if it cancelled
	cancelled bool  // the client gave up on purpose before the answer was whole
	sent      time.Time
	done      time.Time
}

// fetch sends r and reads the answer, giving up after cancelAfter (never if
// negative). The body is read as it arrives.
func fetch(cl *http.Client, r *http.Request, cancelAfter time.Duration) outcome {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var gaveUp atomic.Bool
	if cancelAfter >= 0 {
		timer := time.AfterFunc(cancelAfter, func() {
			gaveUp.Store(true)
			cancel()
		})
		defer timer.Stop()
	}
	o := outcome{sent: time.Now()}
	res, err := cl.Do(r.WithContext(ctx))
	if err != nil {
		o.done, o.phase = time.Now(), phaseBeforeHeaders
		if gaveUp.Load() {
			o.cancelled = true
		} else {
			o.err = err
		}
		return o
	}
	defer res.Body.Close()
	o.res = response{Status: res.StatusCode, Header: res.Header}
	o.res.Body, err = io.ReadAll(res.Body)
	o.done = time.Now()
	if err != nil {
		o.phase = phaseMidBody
		if gaveUp.Load() {
			o.cancelled = true
		} else {
			o.err = err
		}
		return o
	}
	o.phase = phaseComplete
	return o
}

// Kinds of answers.
const (
	kindNew          = "new"          // a 2xx from the upstream, not replayed
	kindReplay       = "replay"       // a 2xx marked Idempotent-Replayed
	kindUpstream5xx  = "upstream-5xx" // a 5xx from the upstream (not stored)
	kindConflict     = "409"          // 409 outstanding
	kindUnreplayable = "409-unreplayable"
	kindUnavailable  = "503"   // 503 store unavailable
	kindOther        = "other" // anything else
)

// The problem titles that the README documents.
var problemTitles = map[string]string{
	"outstanding":       "A request is outstanding for this Idempotency-Key",
	"unreplayable":      "The response for this Idempotency-Key cannot be replayed",
	"store-unavailable": "Idempotency store unavailable",
}

// classify names an answer of the fault upstream behind the handler, and
// says what is wrong with it if it is not well formed.
func classify(r response) (string, error) {
	ct := r.Header.Get("Content-Type")
	switch {
	case r.Status == http.StatusConflict && ct == "application/problem+json":
		anchor := problemAnchor(r)
		switch anchor {
		case "outstanding":
			return kindConflict, checkProblem(r, anchor, true)
		case "unreplayable":
			return kindUnreplayable, checkProblem(r, anchor, false)
		}
		return kindOther, fmt.Errorf("409 problem of unknown type: %s", r)
	case r.Status == http.StatusServiceUnavailable && ct == "application/problem+json":
		return kindUnavailable, checkProblem(r, "store-unavailable", true)
	case r.Header.Get(fHdrRun) == "":
		return kindOther, fmt.Errorf("an answer neither from the upstream nor a documented problem: %s", r)
	case ct != fContentType:
		return kindOther, fmt.Errorf("upstream answer with Content-Type %q: %s", ct, r)
	case r.Status >= 500:
		if r.replayed() {
			return kindOther, fmt.Errorf("a 5xx replayed: %s", r)
		}
		return kindUpstream5xx, nil
	case r.Status < 200 || r.Status > 299:
		return kindOther, fmt.Errorf("unexpected status: %s", r)
	case r.replayed():
		if cl := r.Header.Get("Content-Length"); cl != strconv.Itoa(len(r.Body)) {
			return kindReplay, fmt.Errorf("replay with Content-Length %q and %d bytes", cl, len(r.Body))
		}
		return kindReplay, nil
	case r.Header.Get("Idempotent-Replayed") != "":
		return kindNew, fmt.Errorf("Idempotent-Replayed %q on a first answer", r.Header.Get("Idempotent-Replayed"))
	}
	return kindNew, nil
}

// checkProblem is a non-fatal wantProblem: status from the body, the
// documented type and title, and Retry-After when retryAfter.
func checkProblem(r response, anchor string, retryAfter bool) error {
	var p problemBody
	if err := json.Unmarshal(r.Body, &p); err != nil {
		return fmt.Errorf("problem body is not JSON (%v): %s", err, r)
	}
	switch {
	case p.Status != r.Status:
		return fmt.Errorf("problem status %d on a %d answer: %s", p.Status, r.Status, r)
	case !strings.HasSuffix(p.Type, "#"+anchor):
		return fmt.Errorf("problem type %q, want #%s: %s", p.Type, anchor, r)
	case p.Title != problemTitles[anchor]:
		return fmt.Errorf("problem title %q, want %q", p.Title, problemTitles[anchor])
	case retryAfter && r.Header.Get("Retry-After") == "":
		return fmt.Errorf("no Retry-After: %s", r)
	case !retryAfter && r.Header.Get("Retry-After") != "":
		return fmt.Errorf("unexpected Retry-After: %s", r)
	case r.replayed():
		return fmt.Errorf("a refusal marked as replayed: %s", r)
	}
	return nil
}

// runOf is the upstream run number an answer names, 0 if none.
func runOf(r response) int {
	n, _ := strconv.Atoi(r.Header.Get(fHdrRun))
	return n
}

// violations collects broken invariants from any goroutine.
type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, fmt.Sprintf(format, args...))
}

func (v *violations) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.list)
}

// report fails t with the violations found, the first 40 in full.
func (v *violations) report(t testing.TB) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, s := range v.list {
		if i == 40 {
			t.Errorf("... and %d more violations", len(v.list)-40)
			break
		}
		t.Errorf("violation: %s", s)
	}
}

// tally counts named events from any goroutine.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *tally) add(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]int)
	}
	c.m[name] += n
}

func (c *tally) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// String lists the counts by name.
func (c *tally) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, 0, len(c.m))
	for n := range c.m {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", n, c.m[n])
	}
	return b.String()
}

// durations summarises a sample: count, min, median, p90, max.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none measured"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d min=%v median=%v p90=%v max=%v", len(s), s[0].Round(time.Millisecond), q(0.5), q(0.9), s[len(s)-1].Round(time.Millisecond))
}

// histogram renders counts of executions per key.
func histogram(h map[int]int) string {
	ns := make([]int, 0, len(h))
	for n := range h {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d run(s): %d keys", n, h[n])
	}
	return b.String()
}

// randDuration is a uniform duration in [lo, hi].
func randDuration(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// ms renders d as a whole number of milliseconds for the fault headers.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// durableRedis is a redis-server with an append-only file synced on every
// write (appendfsync always), so that a SIGKILL loses no acknowledged
// write: what a fault test then sees is the handler's behaviour, not the
// data loss of a Redis without persistence (testredis runs none).
type durableRedis struct {
	bin  string
	dir  string
	port int

	mu      sync.Mutex
	process *testproc.Proc // nil once killed
}

func startDurableRedis(t testing.TB) *durableRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (install the redis-server package): %v", err)
	}
	r := &durableRedis{bin: bin, dir: t.TempDir()}
	t.Cleanup(r.Kill)
	for attempt := 1; ; attempt++ {
		r.port = freePort(t)
		if err = r.start(); err == nil {
			return r
		}
		if attempt == 3 {
			t.Fatalf("starting a durable redis-server: %v", err)
		}
	}
}

func (r *durableRedis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

func (r *durableRedis) start() error {
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no")
	p, err := testproc.Start(cmd, filepath.Join(r.dir, "redis.log"), testproc.Ready{
		Check: func() error {
			c := goredis.NewClient(&goredis.Options{Addr: r.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
			defer c.Close()
			return c.Ping(context.Background()).Err()
		},
		What:    "answer PING on " + r.Addr(),
		Timeout: 10 * time.Second,
		Poll:    20 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.process = p
	r.mu.Unlock()
	return nil
}

// Kill sends SIGKILL and waits for the exit.
func (r *durableRedis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.process != nil {
		r.process.Kill()
		r.process = nil
	}
}

// Restart starts the server again on its port and data, after Kill.
func (r *durableRedis) Restart(t testing.TB) {
	t.Helper()
	r.Kill()
	if err := testproc.Retry(20, 50*time.Millisecond, r.start); err != nil {
		t.Fatalf("restarting the durable redis-server on port %d: %v", r.port, err)
	}
}
