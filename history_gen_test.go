package idempotency

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The history suite's histories: what one run of the suite does to one
// store, drawn from a seed. A history is a route's options, the instances
// that serve it, the scripts of several keys (requests at offsets, each
// with what the upstream does for it), and faults. history_run_test.go
// plays it against real servers; history_model_test.go checks what came
// back against the model of a key's life.

// histLease is every history's lock_timeout: the shortest the handler
// takes, so that leases pass within a history.
const histLease = time.Second

// behaviour is what the upstream does with one request.
type behaviour uint8

const (
	upFast        behaviour = iota // 201 at once
	upSlow                         // 201 after 1.6 leases: the claim is renewed meanwhile
	upClientError                  // 400: an answer, stored
	upConflict                     // 409: stored, or released with release_statuses 409
	upServerError                  // 503: released
	upTooMany                      // 429: released by the default release_statuses
	upPanic                        // the upstream dies: no answer, though it may have acted
	upHang                         // no answer until its work is cancelled
	upLarge                        // 201 with a body over a small max_response_body
	upNoContent                    // 204
	upSlowError                    // 503 after 1.6 leases: released late, a waiter past its lease claims
	numBehaviours
)

var behaviourNames = [numBehaviours]string{"fast", "slow", "400", "409", "503", "429", "panic", "hang", "large", "204", "slow503"}

func (b behaviour) String() string { return behaviourNames[b] }

// histRoute is the route's options, drawn per history.
type histRoute struct {
	wait        time.Duration // on_conflict wait <wait>; 0 is reject
	keep        bool          // on_unknown_outcome keep
	failOpen    bool          // on_store_error fail_open
	release409  bool          // release_statuses 409, in place of the default
	keyInBody   bool          // key_from json /id
	fingerprint string        // body, json or none
	sealed      bool          // encryption_keys
	smallMax    bool          // max_response_body 512
	ttl         time.Duration
}

func (r histRoute) String() string {
	var opts []string
	if r.wait > 0 {
		opts = append(opts, "on_conflict wait "+r.wait.String())
	} else {
		opts = append(opts, "on_conflict reject")
	}
	if r.keep {
		opts = append(opts, "on_unknown_outcome keep")
	}
	if r.failOpen {
		opts = append(opts, "on_store_error fail_open")
	}
	if r.release409 {
		opts = append(opts, "release_statuses 409")
	}
	if r.keyInBody {
		opts = append(opts, "key_from json /id")
	}
	opts = append(opts, "fingerprint "+r.fingerprint)
	if r.sealed {
		opts = append(opts, "encryption_keys")
	}
	if r.smallMax {
		opts = append(opts, "max_response_body 512")
	}
	opts = append(opts, "ttl "+r.ttl.String(), "lock_timeout "+histLease.String())
	return strings.Join(opts, "; ")
}

// histRequest is one request of a key's script.
type histRequest struct {
	at        time.Duration // offset from the history's start
	instance  int
	path      string // /pay or /refund: two endpoints
	body      int    // 0 and 1 are one payload in JSON (two spellings); 2 is another
	behaviour behaviour
}

func (q histRequest) String() string {
	return fmt.Sprintf("@%v i%d %s body%d %s", q.at, q.instance, q.path, q.body, q.behaviour)
}

// histKey is one key's script.
type histKey struct {
	name string
	reqs []histRequest
}

// faultKind is what a fault does.
type faultKind uint8

const (
	faultStall  faultKind = iota // the instance's store link swallows everything for dur, then is cut and healed
	faultCut                     // the instance's store connections are cut
	faultDeath                   // the instance dies; another starts in its place on what it left
	faultFull                    // Redis is full for dur
	faultReload                  // the instance's config is reloaded, the store block changed or not
	faultSlow                    // never drawn: a store call of the instance took over slowCall (a loaded machine)
)

type histFault struct {
	at, dur  time.Duration
	kind     faultKind
	instance int
	changed  bool // a reload that changes the store block
}

func (f histFault) String() string {
	switch f.kind {
	case faultStall:
		return fmt.Sprintf("@%v stall i%d for %v", f.at, f.instance, f.dur)
	case faultCut:
		return fmt.Sprintf("@%v cut i%d", f.at, f.instance)
	case faultDeath:
		return fmt.Sprintf("@%v death i%d", f.at, f.instance)
	case faultFull:
		return fmt.Sprintf("@%v redis full for %v", f.at, f.dur)
	case faultSlow:
		return fmt.Sprintf("@%v a store call of i%d took %v", f.at, f.instance, f.dur)
	}
	return fmt.Sprintf("@%v reload i%d (store block changed %v)", f.at, f.instance, f.changed)
}

// history is one history, replayable from its seed.
type history struct {
	seed      uint64
	store     string
	instances int
	route     histRoute
	keys      []histKey
	faults    []histFault
}

func (h *history) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, store %s, %d instance(s)\n  route: %s\n", h.seed, h.store, h.instances, h.route)
	for _, f := range h.faults {
		fmt.Fprintf(&b, "  fault %s\n", f)
	}
	for _, k := range h.keys {
		fmt.Fprintf(&b, "  key %s:", k.name)
		for i, q := range k.reqs {
			if i > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(&b, " %s", q)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// shared reports whether several instances can share the store.
func sharedStore(store string) bool { return store == "redis" || store == "postgres" }

// generate draws the history of seed for store.
func generate(seed uint64, store string) *history {
	r := rand.New(rand.NewPCG(seed, 0x1d3))
	pick := func(n int) int { return r.IntN(n) }
	chance := func(p float64) bool { return r.Float64() < p }
	h := &history{seed: seed, store: store, instances: 1}
	if sharedStore(store) && chance(0.5) {
		h.instances = 2
	}
	route := &h.route
	switch pick(3) {
	case 1:
		route.wait = 400 * time.Millisecond // below the lease
	case 2:
		route.wait = 2500 * time.Millisecond // past it
	}
	route.keep = chance(0.5)
	route.failOpen = chance(0.15)
	route.release409 = chance(0.2)
	route.keyInBody = chance(0.2)
	route.fingerprint = []string{"body", "json", "none"}[pick(3)]
	route.sealed = chance(0.2)
	route.smallMax = chance(0.3)
	route.ttl = time.Minute
	if chance(0.15) {
		route.ttl = 4 * time.Second
	}

	// Behaviours are weighted towards the ordinary: most requests succeed.
	weights := [numBehaviours]int{upFast: 30, upSlow: 10, upClientError: 6, upConflict: 5, upServerError: 8,
		upTooMany: 5, upPanic: 5, upHang: 3, upLarge: 5, upNoContent: 4, upSlowError: 6}
	total := 0
	for _, w := range weights {
		total += w
	}
	drawBehaviour := func() behaviour {
		n := pick(total)
		for b, w := range weights {
			if n < w {
				return behaviour(b)
			}
			n -= w
		}
		return upFast
	}
	for k := range 3 + pick(4) {
		key := histKey{name: fmt.Sprintf("k%d", k)}
		path, body := "/pay", pick(2)
		for range 1 + pick(4) {
			q := histRequest{at: time.Duration(pick(3500)) * time.Millisecond, instance: pick(h.instances),
				path: path, body: body, behaviour: drawBehaviour()}
			// Mostly retries of one request; sometimes the key reused
			// for another payload or endpoint, or spelled another way.
			switch {
			case chance(0.1):
				q.body = 2
			case chance(0.08):
				q.path = "/refund"
			case chance(0.2):
				q.body = 1 - min(body, 1)
			}
			key.reqs = append(key.reqs, q)
		}
		slices.SortStableFunc(key.reqs, func(a, b histRequest) int { return int(a.at - b.at) })
		h.keys = append(h.keys, key)
	}

	// At most two faults, so that what each excuses stays clear.
	for range pick(3) {
		f := histFault{at: time.Duration(200+pick(3000)) * time.Millisecond, instance: pick(h.instances)}
		kinds := []faultKind{faultDeath, faultReload}
		if sharedStore(store) {
			kinds = append(kinds, faultStall, faultStall, faultCut)
		}
		if store == "redis" {
			kinds = append(kinds, faultFull)
		}
		f.kind = kinds[pick(len(kinds))]
		switch f.kind {
		case faultStall:
			f.dur = []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second}[pick(3)]
		case faultFull:
			f.dur = time.Duration(500+pick(2500)) * time.Millisecond
		case faultReload:
			f.changed = chance(0.5)
		}
		h.faults = append(h.faults, f)
	}
	slices.SortStableFunc(h.faults, func(a, b histFault) int { return int(a.at - b.at) })
	return h
}
