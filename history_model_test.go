package idempotency

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The model of one key's life: what the README and docs/guarantees.md
// promise, as the answers a request may get given what happened before.
//
// The upstream's log is the ground truth of what ran: each run knows its
// request. Each run ends as the failure table says (decideClaimEnd): its
// answer stored, kept whole or not, released, or kept as an unknown
// outcome. A run is troubled when a fault touched its instance while it
// held its claim (a drawn fault, or a store call slower than slowCall): its claim may then be lost (a dead owner's, taken over
// once its lease passed) and its end may not reach the store, so it may
// also end as a dead owner's. Requests that saw the store fail, and whose
// claim may have landed all the same, hold the key for a lease past the
// fault. Time is judged with slack: a request's claim is sent a moment
// before the upstream sees it, and its record is stored a moment after.
//
// The invariants, checked on every history (history_test.go), are:
//
//  1. no two runs of a key overlap, unless the first was troubled and its
//     instance's log says its claim was in danger;
//  2. no key runs again while it holds a record of an earlier run (stored,
//     kept whole or not, or with keep an unknown outcome), unless its ttl
//     passed, the first run was troubled and its claim released with the
//     dead owner's lease, the record died with a memory store's process, or
//     the run was unprotected (fail_open while the store failed);
//  3. every replay is byte for byte the answer of a run of the same key,
//     endpoint and payload, that may have been stored;
//  4. a refusal by the module is answered only when the model allows it,
//     and never with a run: 409 while a claim of the same binding may be
//     held, 422 when the key is bound to another endpoint or payload, 502
//     outcome-unknown only after a run of the same binding that may have
//     been lost, 409 unreplayable after one too large, 503 only while the
//     store fails, so that a 503 is never followed by a 502 unless another
//     request of the key reached the upstream;
//  5. with another endpoint or payload, no request gets another request's
//     answer or outcome (3 and 4 compare bindings);
//  6. once the history is quiet, a probe of every key is answered, and not
//     with 409 outstanding or 503;
//  7. the upstream receives each request's own body.

// slack is the time the model allows between a claim and the upstream
// seeing its request, or between the upstream's answer and its record.
const slack = 500 * time.Millisecond

// cancelLag is how late a hung upstream may notice that reverse_proxy
// cancelled its request: its run ends when it does, after the handler
// released the claim.
const cancelLag = 100 * time.Millisecond

type runClass uint8

const (
	classStored    runClass = iota // its answer is the key's record: replayed
	classTruncated                 // ran, but nothing to replay: 409 unreplayable
	classReleased                  // the retry runs again
	classUnknown                   // with keep: 502 outcome-unknown until ttl
)

var classNames = [...]string{"stored", "truncated", "released", "unknown"}

func (c runClass) String() string { return classNames[c] }

// modelRun is an upstream run with what the model derives of it.
type modelRun struct {
	*upstreamRun
	req         *histResult
	class       runClass // as the failure table says
	troubled    bool     // a fault touched its instance while it held its claim
	unprotected bool     // it may have run without a claim: fail_open while the store failed
	// holdUntil is the latest its claim may be held; freeFrom, for a
	// troubled run, the earliest a dead owner's claim may be taken over:
	// no renewal lands after the fault began, or after the run ended.
	holdUntil, freeFrom time.Duration
}

// binding is what a key is bound to: the endpoint and the payload as the
// route's fingerprint mode sees it.
type binding struct {
	path    string
	payload int
}

type keyModel struct {
	run      *histRun
	runs     []*modelRun // of every key, in order of start
	byReq    map[string]*modelRun
	failures []string
}

func (m *keyModel) fail(format string, args ...any) {
	m.failures = append(m.failures, fmt.Sprintf(format, args...))
}

func (m *keyModel) bindingOf(q histRequest) binding {
	b := binding{path: q.path, payload: q.body}
	switch m.run.h.route.fingerprint {
	case "json":
		if q.body < 2 {
			b.payload = 0 // 0 and 1 are one JSON payload, spelled two ways
		}
	case "none":
		b.payload = 0
	}
	return b
}

// ending is the failure table for behaviour b under the route's options.
func (m *keyModel) ending(b behaviour) runClass {
	r := m.run.h.route
	unknown := classReleased
	if r.keep {
		unknown = classUnknown
	}
	switch b {
	case upConflict:
		if r.release409 {
			return classReleased
		}
	case upServerError, upSlowError:
		return classReleased
	case upTooMany:
		if !r.release409 {
			return classReleased
		}
	case upPanic, upHang:
		return unknown
	case upLarge:
		if r.smallMax {
			return classTruncated
		}
	}
	return classStored
}

// deadClass is what a run becomes when its owner's claim dies.
func (m *keyModel) deadClass() runClass {
	if m.run.h.route.keep {
		return classUnknown
	}
	return classReleased
}

// faultsOn are the fault windows that touch a request of instance sent at
// sent, until to: its own, and a full Redis, which every instance shares.
// A death touches only what its process had under way, and what was sent
// until another took its place.
func (m *keyModel) faultsOn(instance int, sent, to time.Duration) []faultWindow {
	var out []faultWindow
	for _, w := range m.run.faultsAt {
		switch {
		case w.f.kind == faultReload || (w.f.instance != instance && w.f.kind != faultFull):
		case w.f.kind == faultDeath && (w.end < sent || w.start > to):
		case w.start <= to && w.end+m.stale(w) >= sent-slack:
			out = append(out, w)
		}
	}
	return out
}

// stale is how long after a cut or stall the store's own connections may
// still fail a call: pgx hands out an idle connection without a ping if it
// was idle less than a second, and one the fault broke fails its
// statement (a 503, as an outage). go-redis retries on another.
func (m *keyModel) stale(w faultWindow) time.Duration {
	if m.run.h.store == "postgres" && (w.f.kind == faultCut || w.f.kind == faultStall) {
		return time.Second
	}
	return 0
}

// storeFailed reports whether the store may have failed the calls of a
// request of instance sent at sent, until to: a stall, a cut, a death, or
// a full Redis (which refuses new claims).
func (m *keyModel) storeFailed(instance int, sent, to time.Duration) bool {
	return len(m.faultsOn(instance, sent, to+slack)) > 0
}

// forgotten reports whether a memory store forgot a's claim before b
// came: the process that took a died, and b went to the next one. Judged
// by the generation that took each, not by when they were sent: a request
// sent as its process died may have gone to either.
func (m *keyModel) forgotten(a, b *histResult) bool {
	return m.run.h.store == "memory" && b.gen > a.gen
}

func newModel(run *histRun) *keyModel {
	m := &keyModel{run: run, byReq: make(map[string]*modelRun)}
	reqs := make(map[string]*histResult)
	for _, res := range run.results {
		res.gen = run.servedBy[res.id]
		reqs[res.id] = res
	}
	for _, u := range run.runs {
		req := reqs[u.reqID]
		if req == nil {
			m.fail("the upstream ran %q, which no client sent", u.reqID)
			continue
		}
		r := &modelRun{upstreamRun: u, req: req, class: m.ending(req.req.behaviour)}
		inst := req.req.instance
		// The claim is made before the run starts, and held until a moment
		// after it ends; a fault meanwhile may cost it.
		faults := m.faultsOn(inst, req.sent, u.end+slack)
		r.holdUntil = u.end + slack
		if len(faults) > 0 {
			r.troubled = true
			last, first := u.end, u.end
			for _, w := range faults {
				last, first = max(last, w.end), min(first, w.start)
			}
			r.freeFrom = max(req.sent, first) + 2*histLease/3 - slack
			// The claim dies with the lease it had, or is kept by retried
			// ends until the lease passes.
			r.holdUntil = last + histLease + slack
			// With fail_open, a claim the store failed to take runs without.
			r.unprotected = m.run.h.route.failOpen && len(m.faultsOn(inst, req.sent, u.start)) > 0
		}
		m.runs = append(m.runs, r)
		m.byReq[u.reqID] = r
	}
	return m
}

// check runs the model over every request of every key.
func (m *keyModel) check() []string {
	byKey := make(map[string][]*histResult)
	for _, res := range m.run.results {
		byKey[res.key] = append(byKey[res.key], res)
	}
	for _, k := range m.run.h.keys {
		for _, res := range byKey[m.run.play+"-"+k.name] {
			m.checkRequest(res)
		}
	}
	m.checkOverlaps()
	return m.failures
}

// classes are the endings that r may have had.
func (m *keyModel) classes(r *modelRun) []runClass {
	if r.troubled {
		return []runClass{r.class, m.deadClass()}
	}
	return []runClass{r.class}
}

// priorRuns are the runs of res's key, other than res's own, whose request
// was sent before res ended (its claim may have been made by then), and
// that the store has not forgotten since.
func (m *keyModel) priorRuns(res *histResult) []*modelRun {
	var out []*modelRun
	for _, r := range m.runs {
		if r.req.key == res.key && r.req != res && r.req.sent <= res.done && !m.forgotten(r.req, res) {
			out = append(out, r)
		}
	}
	return out
}

// heldDuring reports whether a claim of binding b on res's key may have
// been held at some moment of [from, to], by a run or by a request whose
// claim may have landed while the store failed.
func (m *keyModel) heldDuring(res *histResult, b binding, from, to time.Duration) bool {
	for _, r := range m.priorRuns(res) {
		if m.bindingOf(r.req.req) == b && r.req.sent <= to && r.holdUntil >= from {
			return true
		}
	}
	for _, p := range m.unrun(res, b, to) {
		// A request without a run: if the store failed under it, or its
		// process died, its claim may have landed, and holds until its
		// lease passes after the fault, or until it is withdrawn.
		inst := p.req.instance
		faults := m.faultsOn(inst, p.sent, p.done+slack)
		if len(faults) == 0 {
			continue
		}
		last := p.done
		for _, w := range faults {
			last = max(last, w.end)
		}
		if last+histLease+slack >= from && !m.forgotten(p, res) {
			return true
		}
	}
	return false
}

// recorded reports whether a record of a run of res's key may stand at
// some moment of [from, to] with a binding for which match is true, in one
// of the classes.
func (m *keyModel) recorded(res *histResult, from, to time.Duration, match func(binding) bool, classes ...runClass) bool {
	ttl := m.run.h.route.ttl
	for _, r := range m.priorRuns(res) {
		if !match(m.bindingOf(r.req.req)) || r.req.sent > to {
			continue
		}
		for i, c := range m.classes(r) {
			// A record lives ttl from its run's end; a dead owner's claim,
			// kept ttl past its lease, becomes its unknown outcome when a
			// retry finds it, which lives ttl from then.
			until := r.end + ttl + slack
			if i > 0 {
				until = r.holdUntil + 2*ttl
			}
			if slices.Contains(classes, c) && until >= from {
				return true
			}
		}
	}
	return false
}

func (m *keyModel) checkRequest(res *histResult) {
	who := fmt.Sprintf("%s (%s, sent %v, done %v)", res.id, res.req, res.sent.Round(time.Millisecond), res.done.Round(time.Millisecond))
	b := m.bindingOf(res.req)
	same := func(o binding) bool { return o == b }
	other := func(o binding) bool { return o != b }
	own := m.byReq[res.id]
	s, e := res.sent-slack, res.done+slack
	inst := res.req.instance
	failed := m.storeFailed(inst, res.sent, res.done)

	if own != nil && !bytes.Equal(own.body, res.sentBody) {
		m.fail("%s: the upstream received %q, not the request's body %q (invariant 7)", who, own.body, res.sentBody)
	}
	if res.index < 0 && (res.err != nil || res.problem == "outstanding" || res.problem == "store-unavailable") {
		m.fail("%s: the probe after the history was quiet got %s (invariant 6)", who, describeResult(res))
		return
	}
	switch {
	case res.err != nil:
		if res.req.behaviour != upHang && !m.died(inst, res.sent, res.done) {
			m.fail("%s: no answer (%v), though its upstream does not hang and its instance did not die", who, res.err)
		}
	case res.replayed:
		m.checkReplay(who, res, b)
		if own != nil {
			m.fail("%s: replayed, yet it reached the upstream as run %d (invariant 4)", who, own.id)
		}
	case res.problem != "":
		if own != nil {
			m.fail("%s: refused with %s, yet it reached the upstream as run %d (invariant 4)", who, res.problem, own.id)
		}
		allowed := false
		switch res.problem {
		case "outstanding":
			allowed = m.heldDuring(res, b, s, e) || m.concurrentHere(res)
		case "key-reused":
			allowed = m.heldOther(res, b, s, e) ||
				m.recorded(res, s, e, other, classStored, classTruncated, classUnknown) || m.diedUnanswered(res, other)
		case "outcome-unknown":
			allowed = m.recorded(res, s, e, same, classUnknown) || m.diedUnanswered(res, same) || m.cutOffUnconfirmed(res, b)
		case "unreplayable":
			allowed = m.recorded(res, s, e, same, classTruncated)
		case "store-unavailable":
			allowed = (failed || m.withdrawalPending(res)) && !m.run.h.route.failOpen
		}
		if !allowed {
			m.fail("%s: refused with %s, which nothing before it allows (invariant 4)", who, res.problem)
		}
	case own == nil:
		m.fail("%s: answered %d %q without a run or a replay", who, res.status, res.body)
	default:
		m.checkRun(who, res, own, b)
	}
}

// heldOther reports whether a claim of a binding other than b may have
// been held during [from, to].
func (m *keyModel) heldOther(res *histResult, b binding, from, to time.Duration) bool {
	for _, o := range []binding{{"/pay", 0}, {"/pay", 1}, {"/pay", 2}, {"/refund", 0}, {"/refund", 1}, {"/refund", 2}} {
		if o != b && m.bindingOf(histRequest{path: o.path, body: o.payload}) == o && m.heldDuring(res, o, from, to) {
			return true
		}
	}
	return false
}

// concurrentHere reports whether another request of res's key was under
// way in the process meanwhile, whatever its binding: a claim waits for
// one under way in its process for at most a second, then is answered 409
// (claimsInFlight). Every instance of a history plays in the test's one
// process, so they share that gate, as two routes of one Caddy do; and a
// request whose instance died lives on in the test's process, holding the
// gate, until its store call returns.
func (m *keyModel) concurrentHere(res *histResult) bool {
	for _, p := range m.run.results {
		if p.key == res.key && p != res && p.sent <= res.done && (p.done >= res.sent || m.died(p.req.instance, p.sent, p.done)) {
			return true
		}
	}
	return false
}

// withdrawalPending reports whether a claim of res's key, sent earlier,
// may not be withdrawn yet: its request never ran, and the store failed
// under it. Until the store takes the withdrawal, the process claims the
// key for no request of it (503). Every instance of a history plays in the
// test's one process, so they share its withdrawals, as two routes of one
// Caddy do.
func (m *keyModel) withdrawalPending(res *histResult) bool {
	for _, p := range m.run.results {
		if p.key == res.key && p != res && m.byReq[p.id] == nil &&
			p.sent <= res.sent && m.storeFailed(p.req.instance, p.sent, p.done) {
			return true
		}
	}
	return false
}

// diedUnanswered reports whether, with keep, a request of res's key and a
// binding for which match is true went unanswered because its process died
// while it claimed or ran: its claim is then a dead owner's, which may have
// run (the client cannot know, nor can the store), and becomes its unknown
// outcome, bound as the dead claim was.
func (m *keyModel) diedUnanswered(res *histResult, match func(binding) bool) bool {
	for _, p := range m.run.results {
		if p.key == res.key && p != res && p.err != nil && p.sent <= res.done && match(m.bindingOf(p.req)) &&
			m.run.h.route.keep && m.died(p.req.instance, p.sent, p.done) {
			return true
		}
	}
	return false
}

// cutOffUnconfirmed reports whether, with keep and two instances, a
// request of res's key and binding b that never ran saw its instance lose
// the store for longer than a lease: its claim may have landed unconfirmed
// and outlived its lease before its withdrawal could land, and the other
// instance then takes it over as a dead owner's, an unknown outcome (the
// limit that docs/guarantees.md states).
func (m *keyModel) cutOffUnconfirmed(res *histResult, b binding) bool {
	if !m.run.h.route.keep || m.run.h.instances < 2 {
		return false
	}
	for _, p := range m.unrun(res, b, res.done) {
		for _, w := range m.faultsOn(p.req.instance, p.sent, p.done) {
			if w.f.kind != faultDeath && w.f.kind != faultFull && w.end >= p.sent+histLease-slack {
				return true
			}
		}
	}
	return false
}

// unrun are the other requests of res's key and binding b, sent by until,
// that never reached the upstream.
func (m *keyModel) unrun(res *histResult, b binding, until time.Duration) []*histResult {
	var out []*histResult
	for _, p := range m.run.results {
		if p.key == res.key && p != res && m.byReq[p.id] == nil && m.bindingOf(p.req) == b && p.sent <= until {
			out = append(out, p)
		}
	}
	return out
}

// died reports whether instance's process died during [from, to].
func (m *keyModel) died(instance int, from, to time.Duration) bool {
	for _, w := range m.run.faultsAt {
		if w.f.kind == faultDeath && w.f.instance == instance && w.start >= from-slack && w.start <= to+slack {
			return true
		}
	}
	return false
}

func (m *keyModel) checkReplay(who string, res *histResult, b binding) {
	var from *modelRun
	for _, r := range m.priorRuns(res) {
		if r.status == res.status && bytes.Equal(r.answer, res.body) && (len(r.answer) > 0 || m.bindingOf(r.req.req) == b) {
			from = r
			break
		}
	}
	switch {
	case from == nil:
		m.fail("%s: replayed %d %q, the answer of no earlier run of its key (invariant 3)", who, res.status, res.body)
	case m.bindingOf(from.req.req) != b:
		m.fail("%s: replayed run %d, of another endpoint or payload %+v (invariant 5)", who, from.id, m.bindingOf(from.req.req))
	case !slices.Contains(m.classes(from), classStored):
		m.fail("%s: replayed run %d, which ended %s and is never replayed (invariant 3)", who, from.id, from.class)
	}
}

func (m *keyModel) checkRun(who string, res *histResult, own *modelRun, b binding) {
	switch {
	case res.status == own.status && bytes.Equal(res.body, own.answer):
	case own.status == 0 && res.status == http.StatusBadGateway:
		// the upstream died: reverse_proxy's own 502
	default:
		m.fail("%s: answered %d %q, not what its run %d answered, %d %q", who, res.status, res.body, own.id, own.status, own.answer)
	}
	if own.unprotected {
		return
	}
	ttl := m.run.h.route.ttl
	for _, r := range m.priorRuns(res) {
		if r.start >= own.start || r.unprotected {
			continue
		}
		if r.end > own.start {
			continue // overlapping runs: checkOverlaps
		}
		// r ended before own started: own may run only if r left no record.
		var allowed bool
		for _, c := range m.classes(r) {
			switch {
			case c == classReleased && (!r.troubled || c == r.class):
				allowed = true
			case c == classReleased && own.start >= r.freeFrom:
				allowed = true // a dead owner's claim, taken over after its lease
			case own.start > r.end+ttl-slack:
				allowed = true // its record expired
			}
		}
		if !allowed {
			m.fail("%s: ran as run %d although run %d of its key (%s, %s) had ended %v before (invariant 2)",
				who, own.id, r.id, r.req.id, r.class, (own.start - r.end).Round(time.Millisecond))
		}
	}
}

// checkOverlaps checks invariant 1 over every key's runs.
func (m *keyModel) checkOverlaps() {
	for i, a := range m.runs {
		for _, b := range m.runs[i+1:] {
			if a.req.key != b.req.key || b.start >= a.end || a.unprotected || b.unprotected {
				continue
			}
			if a.req.req.behaviour == upHang && b.start+cancelLag >= a.end {
				continue // the hung upstream noticed its cancellation a moment late
			}
			if m.forgotten(a.req, b.req) {
				continue
			}
			if a.troubled && m.logged(a.req.key) {
				continue
			}
			m.fail("runs %d (%s) and %d (%s) of key %s ran at once, [%v, %v] and [%v, %v] (invariant 1)",
				a.id, a.req.id, b.id, b.req.id, a.req.key, a.start.Round(time.Millisecond), a.end.Round(time.Millisecond),
				b.start.Round(time.Millisecond), b.end.Round(time.Millisecond))
		}
	}
}

// logged reports whether an instance's log warned about key's claim: a
// failed renewal or a lost claim.
func (m *keyModel) logged(key string) bool {
	hash := store.NewKey("", key).String()
	for _, logs := range m.run.logs {
		for _, e := range logs.All() {
			if e.ContextMap()["key_hash"] == hash && (strings.Contains(e.Message, "renew") || strings.Contains(e.Message, "claim")) {
				return true
			}
		}
	}
	return false
}

func describeResult(res *histResult) string {
	switch {
	case res.err != nil:
		return "no answer: " + res.err.Error()
	case res.problem != "":
		return fmt.Sprintf("%d %s", res.status, res.problem)
	case res.replayed:
		return fmt.Sprintf("the replay %d %q", res.status, res.body)
	}
	return fmt.Sprintf("%d %q", res.status, res.body)
}

// report lists what each request of the history got, for a failure.
func (run *histRun) report() string {
	var b strings.Builder
	b.WriteString(run.h.String())
	b.WriteString("  what happened:\n")
	for _, w := range run.faultsAt {
		fmt.Fprintf(&b, "    fault %s: in force %v to %v\n", w.f, w.start.Round(time.Millisecond), w.end.Round(time.Millisecond))
	}
	results := slices.Clone(run.results)
	slices.SortFunc(results, func(a, c *histResult) int { return int(a.sent - c.sent) })
	for _, res := range results {
		fmt.Fprintf(&b, "    %s %s: sent %v, done %v: %s\n", res.id, res.req, res.sent.Round(time.Millisecond),
			res.done.Round(time.Millisecond), describeResult(res))
	}
	for _, u := range run.runs {
		fmt.Fprintf(&b, "    run %d of %s: %v to %v, answered %d\n", u.id, u.reqID, u.start.Round(time.Millisecond), u.end.Round(time.Millisecond), u.status)
	}
	// The instances' warnings, by key: what the handler saw of its store.
	keys := map[string]string{}
	for _, k := range run.h.keys {
		keys[store.NewKey("", run.play+"-"+k.name).String()] = k.name
	}
	for i, logs := range run.logs {
		for _, e := range logs.All() {
			fields := e.ContextMap()
			if name, ok := keys[fmt.Sprint(fields["key_hash"])]; ok {
				fmt.Fprintf(&b, "    log %d, key %s, @%v: %s %v\n", i, name, e.Time.Sub(run.start).Round(time.Millisecond), e.Message, fields["error"])
			}
		}
	}
	return b.String()
}
