package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// TestSoak mixes every fault of faults_test.go for as long as the SOAK
// environment variable says (a Go duration, e.g. SOAK=2m; give go test a
// -timeout a few minutes above it): two Caddy instances on one Redis,
// clients sending random keys with concurrent duplicates on both instances
// (on_conflict reject and wait), clients that give up at random points,
// slow upstream runs that last several lock_timeouts, upstream 5xx
// answers, Redis SIGKILLed and restarted, and one Caddy or the other
// SIGKILLed and restarted. Redis runs with appendfsync always, so that a
// kill loses no acknowledged write: a key that runs again after a Redis
// kill is the handler's doing, not a Redis without persistence forgetting.
//
// At the end every key is retried once more, and the test prints a report
// and fails on any invariant violation:
//   - a key ran again without a documented reason: the previous run
//     answered 5xx; its Caddy was killed during it (or before it could
//     store the answer); Redis was down during it or when its answer was to
//     be stored; or its client left and it outlived the one more
//     lock_timeout the README grants it;
//   - a key ran again after one of its answers had been replayed;
//   - a client got anything but the upstream's answer, a replay, or a 409
//     or 503 problem, or a transport error from a Caddy that was not
//     killed;
//   - an answer differs from what the upstream sent on the run it names,
//     or replays a run that did not complete;
//   - an upstream run was cancelled although its Caddy lived and its
//     client did not leave it for longer than lock_timeout;
//   - a key is still locked (409) lock_timeout after everything went quiet.
func TestSoak(t *testing.T) {
	spec := os.Getenv("SOAK")
	if spec == "" {
		t.Skip("opt-in soak test: set SOAK to a duration, e.g. SOAK=2m, and -timeout a few minutes above it")
	}
	total, err := time.ParseDuration(spec)
	if err != nil || total <= 0 {
		t.Fatalf("SOAK=%q is not a positive duration", spec)
	}
	s := &soak{
		t:     t,
		rd:    startDurableRedis(t),
		u:     startFaultUpstream(t),
		incs:  make(map[string]*incarnation),
		keys:  make(map[string]*soakKey),
		cl:    newClient(t),
		start: time.Now(),
	}
	s.options = fmt.Sprintf("store redis {\n\taddress %s\n}\nlock_timeout %v", s.rd.Addr(), soakLease)
	s.startSlot(0)
	s.startSlot(1)
	s.run(total)
}

const (
	soakLease   = 3 * time.Second // lock_timeout
	soakWorkers = 8
	soakMaxWait = 3 * time.Second // on_conflict wait, on /wait/*
	soakEvery   = 10 * time.Second
)

type soak struct {
	t       *testing.T
	rd      *durableRedis
	u       *faultUpstream
	cl      *http.Client
	options string
	start   time.Time
	stop    atomic.Bool

	v      violations
	counts tally

	mu         sync.Mutex
	slots      [2]*incarnation
	gens       [2]int
	incs       map[string]*incarnation
	keys       map[string]*soakKey
	obs        []observation
	redisKills []outageTimes
	caddyKills []caddyKill
}

// incarnation is one Caddy process of a slot; a restarted slot is a new
// incarnation, on new ports, with a new name (A1, A2, ...).
type incarnation struct {
	id     string
	proc   *caddyProc
	killed time.Time // when the test killed it; zero while alive (under soak.mu)
}

type outageTimes struct{ killed, restarted time.Time }

type caddyKill struct {
	id            string
	killed, ready time.Time
}

type soakKey struct {
	path       string
	body       []byte
	hdr        []string
	clientLeft atomic.Bool  // a client of the key gave up before the answer was whole
	leftAt     atomic.Int64 // when the first client gave up (unix nanoseconds)
	settled    atomic.Bool
	odd        atomic.Int32 // malformed answers, reported once per key
}

// noteLeft keeps the earliest time a client of k gave up.
func (k *soakKey) noteLeft(at time.Time) {
	for {
		old := k.leftAt.Load()
		if old != 0 && old <= at.UnixNano() || k.leftAt.CompareAndSwap(old, at.UnixNano()) {
			return
		}
	}
}

func (k *soakKey) request(inc *incarnation, key string) *http.Request {
	return req(http.MethodPost, inc.proc.URL+k.path, key, k.body, k.hdr...)
}

// observation is one answer a client read whole.
type observation struct {
	key        string
	kind       string
	run        int
	sum        [32]byte
	sent, done time.Time
}

func (s *soak) startSlot(i int) time.Duration {
	s.gens[i]++
	id := fmt.Sprintf("%c%d", 'A'+i, s.gens[i])
	began := time.Now()
	p := startCaddy(s.t, id, faultSite(s.u, id, s.options, soakMaxWait))
	inc := &incarnation{id: id, proc: p}
	s.mu.Lock()
	s.slots[i] = inc
	s.incs[id] = inc
	s.mu.Unlock()
	return time.Since(began)
}

// pick returns a live incarnation, nil if none.
func (s *soak) pick(r int) *incarnation {
	s.mu.Lock()
	defer s.mu.Unlock()
	var live []*incarnation
	for _, inc := range s.slots {
		if inc != nil && inc.killed.IsZero() {
			live = append(live, inc)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[r%len(live)]
}

func (s *soak) killedAt(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inc := s.incs[id]; inc != nil {
		return inc.killed
	}
	return time.Time{}
}

func (s *soak) run(total time.Duration) {
	t := s.t
	var wg sync.WaitGroup
	seed := uint64(time.Now().UnixNano())
	for w := range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for i := 0; !s.stop.Load(); i++ {
				s.key(rng, fmt.Sprintf("soak-%d-%d", w, i))
			}
		}()
	}

	// The faults, from the test goroutine: every soakEvery, Redis or one
	// of the Caddy instances, in turn, is killed and restarted.
	end := s.start.Add(total)
	next := s.start.Add(soakEvery / 2)
	var restarts []time.Duration
	var probes sync.WaitGroup
	rng := rand.New(rand.NewPCG(seed, 1))
	for event := 0; time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
		s.checkCrashes()
		if time.Now().Before(next) {
			continue
		}
		switch event % 4 {
		case 0, 2:
			s.mu.Lock()
			s.redisKills = append(s.redisKills, outageTimes{killed: time.Now()})
			s.mu.Unlock()
			s.rd.Kill()
			time.Sleep(randDuration(rng, 300*time.Millisecond, maxRedisDown))
			s.rd.Restart(t)
			s.mu.Lock()
			s.redisKills[len(s.redisKills)-1].restarted = time.Now()
			s.mu.Unlock()
		case 1, 3:
			slot := (event / 2) % 2
			s.mu.Lock()
			inc := s.slots[slot]
			inc.killed = time.Now()
			s.mu.Unlock()
			inc.proc.Kill()
			killed := inc.killed
			s.probeTakeovers(inc.id, killed, &probes)
			restarts = append(restarts, s.startSlot(slot))
			s.mu.Lock()
			s.caddyKills = append(s.caddyKills, caddyKill{inc.id, killed, time.Now()})
			s.mu.Unlock()
		}
		event++
		next = next.Add(soakEvery)
	}
	loadEnd := time.Now()
	s.stop.Store(true)
	if !waitGroupWithin(&wg, 2*time.Minute) || !waitGroupWithin(&probes, time.Minute) {
		t.Fatal("the clients did not finish within 2 minutes of the end of the soak")
	}
	s.checkCrashes()
	if !s.u.quiesce(30 * time.Second) {
		s.v.add("the upstream still serves %d requests 30s after the clients stopped", s.u.inflight.Load())
	}

	// Nothing may stay locked: lock_timeout after the last run ended, every
	// key is retried once more.
	time.Sleep(soakLease + time.Second)
	finalStart := time.Now()
	keys := s.u.allKeys()
	reached := make(map[string]bool, len(keys))
	for _, k := range keys {
		reached[k] = true
	}
	s.mu.Lock()
	for k := range s.keys {
		if !reached[k] {
			keys = append(keys, k) // a key that never reached the upstream
		}
	}
	s.mu.Unlock()
	idx := make(chan string)
	var fwg sync.WaitGroup
	for range soakWorkers {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			for key := range idx {
				s.finalRetry(key)
			}
		}()
	}
	for _, k := range keys {
		idx <- k
	}
	close(idx)
	fwg.Wait()
	finalTook := time.Since(finalStart)
	if !s.u.quiesce(30 * time.Second) {
		s.v.add("the upstream still serves %d requests after the final retries", s.u.inflight.Load())
	}
	s.report(keys, loadEnd.Sub(s.start), finalTook, restarts)
}

// probeTakeovers retries, every 20ms on the surviving instance, each key
// whose run the Caddy id was running when it was killed at tk, until the
// key is taken over (or answered): the run that takes over then starts as
// soon as the dead owner's lease lets it, which measures the takeover.
func (s *soak) probeTakeovers(id string, tk time.Time, wg *sync.WaitGroup) {
	var keys []string
	s.u.mu.Lock()
	for key, runs := range s.u.keys {
		if r := runs[len(runs)-1]; r.Instance == id && (!r.Ended || !r.End.Before(tk)) {
			keys = append(keys, key)
		}
	}
	s.u.mu.Unlock()
	s.counts.add("keys probed for takeover", len(keys))
	for _, key := range keys {
		s.mu.Lock()
		k := s.keys[key]
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(soakLease + 15*time.Second)
			for i := 0; time.Now().Before(deadline); i++ {
				switch kind, _ := s.send(key, k, i, -1); kind {
				case kindConflict, kindUnavailable, kindUpstream5xx, "":
					time.Sleep(20 * time.Millisecond)
				default:
					return
				}
			}
		}()
	}
}

// checkCrashes restarts, as a violation, a Caddy that died by itself.
func (s *soak) checkCrashes() {
	for i := range s.slots {
		s.mu.Lock()
		inc := s.slots[i]
		crashed := inc.killed.IsZero() && inc.proc.Exited()
		if crashed {
			inc.killed = time.Now() // its runs may run again, as after a kill
		}
		s.mu.Unlock()
		if crashed {
			s.v.add("caddy %s crashed (%v)", inc.id, inc.proc.cmd.ProcessState)
			s.startSlot(i)
		}
	}
}

// key plays one client key: a burst of the request and its duplicates on
// random instances, some of whose clients give up, then retries until an
// answer settles it, and sometimes one more retry.
func (s *soak) key(rng *rand.Rand, key string) {
	k := &soakKey{path: "/orders"}
	if rng.IntN(10) < 3 {
		k.path = "/wait/orders"
	}
	latency := randDuration(rng, 20*time.Millisecond, 200*time.Millisecond)
	long := rng.IntN(10) == 0
	if long {
		latency = randDuration(rng, 4*time.Second, 8*time.Second) // 1.3 to 2.7 lock_timeouts
	}
	status := "201"
	if rng.IntN(20) == 0 {
		status = "503,201" // the first run fails; the retry runs again
	}
	k.hdr = []string{"Host", "api.test",
		fHdrLatency, ms(latency),
		fHdrStatus, status,
		fHdrChunks, strconv.Itoa(1 + rng.IntN(4)),
		fHdrGap, ms(randDuration(rng, 5*time.Millisecond, 40*time.Millisecond)),
	}
	k.body = []byte(fmt.Sprintf(`{"key":%q,"amount":%d}`, key, rng.IntN(100000)))
	s.mu.Lock()
	s.keys[key] = k
	s.mu.Unlock()

	n := 1 + rng.IntN(4)
	spread := 150 * time.Millisecond
	if long {
		spread = latency // duplicates arrive throughout the run
	}
	var wg sync.WaitGroup
	for j := range n {
		offset := time.Duration(0)
		if j > 0 {
			offset = randDuration(rng, 0, spread)
		}
		cancelAfter := time.Duration(-1)
		if rng.IntN(10) < 3 {
			cancelAfter = randDuration(rng, 0, 300*time.Millisecond)
		}
		r := rng.IntN(2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(offset)
			s.send(key, k, r, cancelAfter)
		}()
	}
	wg.Wait()

	deadline := time.Now().Add(latency + 40*time.Second)
	for !k.settled.Load() {
		if time.Now().After(deadline) {
			s.v.add("key %s did not settle within %v", key, latency+40*time.Second)
			return
		}
		time.Sleep(50 * time.Millisecond)
		s.send(key, k, rng.IntN(2), -1)
	}
	if rng.IntN(2) == 0 {
		s.send(key, k, rng.IntN(2), -1)
	}
}

// send makes one request of key to a live instance and accounts for what
// the client saw.
func (s *soak) send(key string, k *soakKey, r int, cancelAfter time.Duration) (string, response) {
	inc := s.pick(r)
	if inc == nil {
		s.counts.add("no live instance", 1)
		time.Sleep(100 * time.Millisecond)
		return "", response{}
	}
	if cancelAfter >= 0 {
		// Marked before sending: the run may see the client leave at once.
		k.clientLeft.Store(true)
	}
	o := fetch(s.cl, k.request(inc, key), cancelAfter)
	s.counts.add("requests", 1)
	switch {
	case o.err != nil && !s.killedAt(inc.id).IsZero():
		s.counts.add("transport error from a killed caddy", 1)
		return "", response{}
	case o.err != nil:
		s.counts.add("transport error (unexpected)", 1)
		s.v.add("key %s: transport error from %s, which was not killed: %v", key, inc.id, o.err)
		return "", response{}
	case o.cancelled:
		s.counts.add("client gave up "+o.phase, 1)
		k.noteLeft(o.sent.Add(cancelAfter))
		return "", response{}
	}
	kind, err := classify(o.res)
	s.counts.add(kind, 1)
	switch kind {
	case kindNew, kindReplay, kindUnreplayable:
		k.settled.Store(true)
	case kindConflict, kindUnavailable, kindUpstream5xx:
	default:
		if o.res.replayed() {
			k.settled.Store(true) // a replay is final, even a wrong one
		}
		if k.odd.Add(1) > 1 {
			return kind, o.res // reported once per key
		}
		if err == nil {
			err = fmt.Errorf("unexpected answer %s", o.res)
		}
		if o.res.Status == 499 && o.res.replayed() {
			s.counts.add("keys answered with a replayed 499", 1)
			err = fmt.Errorf("a replayed 499 with an empty body: the handler stored reverse_proxy's 499 when it cancelled the run one lock_timeout after its client left (see TestFaultHungUpstreamAfterClientLeft); runs: %s",
				describeRuns(s.u.runs(key)))
		}
	}
	if err != nil {
		s.v.add("key %s via %s: %v", key, inc.id, err)
	}
	ob := observation{key: key, kind: kind, run: runOf(o.res), sent: o.sent, done: o.done}
	if ob.run > 0 {
		ob.sum = sha256.Sum256(o.res.Body)
	}
	s.mu.Lock()
	s.obs = append(s.obs, ob)
	s.mu.Unlock()
	return kind, o.res
}

// finalRetry retries key once everything is quiet: it must not be locked
// or refused; whether it may run again is checked later, with every run.
func (s *soak) finalRetry(key string) {
	s.mu.Lock()
	k := s.keys[key]
	s.mu.Unlock()
	for attempt := range 3 {
		kind, res := s.send(key, k, attempt, -1)
		switch kind {
		case kindConflict:
			s.v.add("key %s still locked (409) %v after the last upstream run ended (lock_timeout %v); its runs: %s%s",
				key, soakLease+time.Second, soakLease, describeRuns(s.u.runs(key)), s.logsOf(key))
			return
		case kindUnavailable:
			s.v.add("key %s: 503 although Redis is up: %s", key, res)
			return
		case kindUpstream5xx, "":
			continue // the upstream failed again, or no live instance: retry
		case kindNew:
			s.counts.add("final retries that ran the key again", 1)
		case kindReplay:
			s.counts.add("final retries replayed", 1)
		case kindUnreplayable:
			s.counts.add("final retries refused as unreplayable", 1)
		}
		return
	}
}

func describeRuns(runs []fRun) string {
	var b strings.Builder
	for i, r := range runs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "run %d via %s at %s for %v: status %d, answered %t, completed %t, cancelled %t", r.N, r.Instance,
			r.Start.Format("15:04:05.000"), r.End.Sub(r.Start).Round(time.Millisecond), r.Status, r.Answered, r.Completed, r.Cancelled)
	}
	return b.String()
}

// logsOf returns the lines of every Caddy's log that name key's hash.
func (s *soak) logsOf(key string) string {
	hash := store.NewKey("", key).String()
	s.mu.Lock()
	incs := make([]*incarnation, 0, len(s.incs))
	for _, inc := range s.incs {
		incs = append(incs, inc)
	}
	s.mu.Unlock()
	var b strings.Builder
	for _, inc := range incs {
		for line := range strings.Lines(inc.proc.Log()) {
			if strings.Contains(line, hash) && !strings.Contains(line, `"http.log.access`) {
				fmt.Fprintf(&b, "\n\t%s: %s", inc.id, strings.TrimSpace(line))
			}
		}
	}
	return b.String()
}

// redisDownDuring reports whether Redis was unusable at some time in
// [from, to]: from its kill until redisRecovery after its restart (the
// clients' pooled connections to the dead server fail meanwhile).
func (s *soak) redisDownDuring(from, to time.Time) bool {
	for _, o := range s.redisKills {
		restarted := o.restarted
		if restarted.IsZero() {
			restarted = time.Now()
		}
		if !o.killed.After(to) && !restarted.Add(redisRecovery).Before(from) {
			return true
		}
	}
	return false
}

const (
	// maxRedisDown bounds the soak's Redis outages: with the restart and
	// redisRecovery, well under lock_timeout.
	maxRedisDown = 1200 * time.Millisecond
	// storeSlack is how long after the upstream's answer the handler may
	// take to store it.
	storeSlack = 500 * time.Millisecond
	// redisRecovery is how long after a Redis restart store calls may still
	// fail.
	redisRecovery = 1500 * time.Millisecond
)

// killedDuring returns when the Caddy that proxied r was killed, if that
// was during r or within grace after it (before it could store r's answer).
func (s *soak) killedDuring(r fRun, grace time.Duration) (time.Time, bool) {
	inc := s.incs[r.Instance]
	if inc == nil {
		return time.Time{}, false
	}
	tk := inc.killed
	if tk.IsZero() || tk.Before(r.Start) || tk.After(r.End.Add(grace)) {
		return time.Time{}, false
	}
	return tk, true
}

// cutByGrace reports whether r was cancelled as the README says a run is
// when its client left: one lock_timeout after the client left.
func cutByGrace(k *soakKey, r fRun) bool {
	left := k.leftAt.Load()
	return r.Cancelled && left != 0 && r.End.Sub(time.Unix(0, left)) >= soakLease-100*time.Millisecond
}

// secondRunReason says why the README allows next after prev, "" if
// nothing does.
func (s *soak) secondRunReason(k *soakKey, prev, next fRun) string {
	switch tk, killed := s.killedDuring(prev, storeSlack); {
	case prev.Answered && prev.Status >= 500:
		return "the previous run answered 5xx"
	case killed && !tk.After(prev.End):
		return "the owner Caddy was killed during the previous run"
	case killed && !tk.After(next.Start):
		return "the owner Caddy was killed after the upstream answered, before storing"
	case s.redisDownDuring(prev.End, prev.End.Add(storeSlack)):
		return "Redis was down when the previous answer was to be stored"
	case cutByGrace(k, prev) && !next.Start.Before(prev.End):
		return "the client left and the previous run outlived one more lock_timeout"
	case s.redisDownDuring(prev.Start, prev.End):
		// The README: lock_timeout must exceed the longest partition from
		// the store that the owner is to survive without a second run.
		// Every outage here is far shorter than lock_timeout.
		return ""
	}
	return ""
}

// report checks every run and every answer against the invariants, prints
// the figures, and fails the test on any violation.
func (s *soak) report(keys []string, loadTook, finalTook time.Duration, restarts []time.Duration) {
	t := s.t
	s.mu.Lock()
	defer s.mu.Unlock()
	byKey := make(map[string][]observation)
	for _, o := range s.obs {
		byKey[o.key] = append(byKey[o.key], o)
	}
	hist := make(map[int]int)
	var reasons, runKinds tally
	var takeovers []time.Duration
	executions := 0
	for _, key := range keys {
		k := s.keys[key]
		runs := s.u.runs(key)
		hist[len(runs)]++
		executions += len(runs)
		for _, r := range runs {
			switch _, killed := s.killedDuring(r, storeSlack); {
			case !r.Ended:
				s.v.add("key %s: run %d never ended", key, r.N)
			case r.Completed && r.Status >= 500:
				runKinds.add("completed with 5xx", 1)
			case r.Completed:
				runKinds.add("completed", 1)
			case killed:
				runKinds.add("cut by a Caddy kill", 1)
			case cutByGrace(k, r):
				runKinds.add("cancelled lock_timeout after its client left", 1)
			default:
				s.v.add("key %s: run %d was cancelled, but its Caddy lived and no client left it for lock_timeout: %s%s", key, r.N, describeRuns(runs), s.logsOfLocked(key))
			}
		}
		for i := 1; i < len(runs); i++ {
			prev, next := runs[i-1], runs[i]
			for _, o := range byKey[key] {
				if o.kind == kindReplay && o.run == prev.N && o.done.Before(next.Start) {
					s.v.add("key %s ran again (run %d) after run %d had been replayed: %s%s", key, next.N, prev.N, describeRuns(runs), s.logsOfLocked(key))
					break
				}
			}
			reason := s.secondRunReason(k, prev, next)
			if reason == "" && s.redisDownDuring(prev.Start, prev.End) {
				s.counts.add("keys run again after a lease lost in a short Redis outage", 1)
				s.v.add("key %s ran again: its owner lost its %v lease in a Redis outage far shorter than that (see TestFaultLeaseSurvivesShortRedisOutage): %s%s",
					key, soakLease, describeRuns(runs), s.logsOfLocked(key))
				continue
			}
			if reason == "" {
				s.v.add("key %s ran again with no documented reason: %s%s", key, describeRuns(runs), s.logsOfLocked(key))
				continue
			}
			reasons.add(reason, 1)
			if next.Start.Before(prev.End) {
				reasons.add("(of which the two runs overlapped)", 1)
			}
			if tk, ok := s.killedDuring(prev, 0); ok && prev.Cancelled && !s.redisDownDuring(tk, next.Start) {
				takeovers = append(takeovers, next.Start.Sub(tk))
			}
		}
		unreplayable := false
		for _, o := range byKey[key] {
			unreplayable = unreplayable || o.kind == kindUnreplayable
		}
		if unreplayable {
			cut := false
			for _, r := range runs {
				cut = cut || r.Answered && r.Cancelled
			}
			if !cut {
				s.v.add("key %s was refused as unreplayable, but no run of it broke off mid-answer: %s", key, describeRuns(runs))
			}
		}
	}
	for _, o := range s.obs {
		if o.run == 0 {
			continue // a problem answer
		}
		runs := s.u.runs(o.key)
		if o.run > len(runs) {
			s.v.add("key %s: an answer names run %d of %d", o.key, o.run, len(runs))
			continue
		}
		r := runs[o.run-1]
		if sha256.Sum256(r.Body) != o.sum {
			s.v.add("key %s: a %s answer of run %d differs from the %d bytes the upstream sent", o.key, o.kind, o.run, len(r.Body))
		}
		if o.kind != kindReplay {
			continue
		}
		if !r.Completed || r.Status >= 500 {
			s.v.add("key %s: replay of run %d, which did not complete with a storable status: %s", o.key, o.run, describeRuns(runs))
		}
		for _, later := range runs[o.run:] {
			if later.Completed && later.Status < 500 && later.End.Add(time.Second).Before(o.sent) {
				s.v.add("key %s: replay of run %d sent after run %d completed: %s", o.key, o.run, later.N, describeRuns(runs))
				break
			}
		}
	}
	// After each restart: when the first request sent after it was served
	// with the store (anything but 503), and when the last such request
	// still got 503.
	var recovery, last503 []time.Duration
	for _, out := range s.redisKills {
		var first, last time.Time
		for _, o := range s.obs {
			if !o.sent.After(out.restarted) || o.sent.After(out.restarted.Add(soakEvery/2)) {
				continue
			}
			if o.kind != kindUnavailable && (first.IsZero() || o.done.Before(first)) {
				first = o.done
			}
			if o.kind == kindUnavailable && o.done.After(last) {
				last = o.done
			}
		}
		if !first.IsZero() {
			recovery = append(recovery, first.Sub(out.restarted))
		}
		if !last.IsZero() {
			last503 = append(last503, last.Sub(out.restarted))
		} else {
			last503 = append(last503, 0)
		}
	}
	var downs []time.Duration
	for _, out := range s.redisKills {
		downs = append(downs, out.restarted.Sub(out.killed))
	}
	clientLeft := 0
	for _, k := range s.keys {
		if k.leftAt.Load() != 0 {
			clientLeft++
		}
	}
	c := &s.counts
	t.Logf(`soak report
  load %v (+ final retries %v), %d client workers, 2 Caddy instances on one Redis (appendfsync always), lock_timeout %v, on_conflict wait %v on /wait/*
  faults: %d Redis SIGKILLs (down %s), %d Caddy SIGKILLs (restart to ready %s)
  timeline (since the start): %s
  requests: %d; answers read whole: new=%d replays=%d 409=%d 409-unreplayable=%d 503=%d upstream-5xx=%d other=%d (keys answered with a replayed 499: %d)
  clients that gave up: before headers %d, mid-body %d; transport errors from killed Caddys %d, unexpected %d; no live instance %d
  final retries: %d replayed, %d ran again, %d unreplayable
  keys: %d (%d with a client that gave up); upstream executions: %d (%s)
  executions per key: %s
  second runs, by documented reason: %s
  keys run again after a lease lost in a short Redis outage: %d
  time to take over a dead owner's claim (kill to the next run's start; %d keys probed every 20ms): %s
  service after a Redis restart: first answer served with the store %s; last 503 %s
  handler errors logged by the Caddys: %s
  invariant violations: %d`,
		loadTook.Round(time.Second), finalTook.Round(time.Millisecond), soakWorkers, soakLease, soakMaxWait,
		len(s.redisKills), durations(downs), len(s.caddyKills), durations(restarts), s.timeline(),
		c.get("requests"), c.get(kindNew), c.get(kindReplay), c.get(kindConflict), c.get(kindUnreplayable), c.get(kindUnavailable), c.get(kindUpstream5xx), c.get(kindOther), c.get("keys answered with a replayed 499"),
		c.get("client gave up "+phaseBeforeHeaders), c.get("client gave up "+phaseMidBody), c.get("transport error from a killed caddy"), c.get("transport error (unexpected)"), c.get("no live instance"),
		c.get("final retries replayed"), c.get("final retries that ran the key again"), c.get("final retries refused as unreplayable"),
		len(keys), clientLeft, executions, &runKinds,
		histogram(hist), &reasons, c.get("keys run again after a lease lost in a short Redis outage"), c.get("keys probed for takeover"), durations(takeovers), durations(recovery), durations(last503), s.loggedErrors(), s.v.count())
	s.v.report(t)
}

// loggedErrors counts the handler's error and warning messages in every
// Caddy's log, for a caller holding s.mu.
func (s *soak) loggedErrors() string {
	var c tally
	for _, inc := range s.incs {
		for line := range strings.Lines(inc.proc.Log()) {
			if !strings.Contains(line, `"logger":"http.handlers.idempotency"`) {
				continue
			}
			var entry struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Level != "info" && entry.Level != "debug" {
				msg, _, _ := strings.Cut(entry.Msg, ";")
				c.add(fmt.Sprintf("%q", msg), 1)
			}
		}
	}
	if len(c.m) == 0 {
		return "none"
	}
	return c.String()
}

// timeline lists the faults in order, for a caller holding s.mu.
func (s *soak) timeline() string {
	type event struct {
		at   time.Duration
		what string
	}
	var events []event
	for _, o := range s.redisKills {
		at := o.killed.Sub(s.start)
		events = append(events, event{at, fmt.Sprintf("%v Redis down %v", at.Round(100*time.Millisecond), o.restarted.Sub(o.killed).Round(10*time.Millisecond))})
	}
	for _, c := range s.caddyKills {
		at := c.killed.Sub(s.start)
		events = append(events, event{at, fmt.Sprintf("%v %s killed", at.Round(100*time.Millisecond), c.id)})
	}
	sort.Slice(events, func(i, j int) bool { return events[i].at < events[j].at })
	parts := make([]string, len(events))
	for i, e := range events {
		parts[i] = e.what
	}
	return strings.Join(parts, ", ")
}

// logsOfLocked is logsOf for a caller holding s.mu.
func (s *soak) logsOfLocked(key string) string {
	s.mu.Unlock()
	defer s.mu.Lock()
	return s.logsOf(key)
}
