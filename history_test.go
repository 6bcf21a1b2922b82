package idempotency

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHistories plays generated histories against every store and checks
// each against the model of a key's life (history_model_test.go). By
// default it plays a fixed budget per store, as CI does. Set
//
//	HISTORY_LONG=30m   to play each store until that much time has passed,
//	HISTORY_SEED=n     to play the history of one seed (with -run to pick the store),
//	HISTORY_PARALLEL=n to play n histories at once (default 8).
//
// A failing history is printed with its seed and what each request got,
// then shrunk: faults, keys and requests are dropped while it still fails,
// and the smallest failing history is printed too.
func TestHistories(t *testing.T) {
	budget, long := historiesPerStore, time.Duration(0)
	if v := os.Getenv("HISTORY_LONG"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("HISTORY_LONG=%s: %v", v, err)
		}
		long, budget = d, 1<<30
	}
	parallel := 8
	if v := os.Getenv("HISTORY_PARALLEL"); v != "" {
		parallel, _ = strconv.Atoi(v)
	}
	base := rand.Uint64() >> 16
	only, one := uint64(0), false
	if v := os.Getenv("HISTORY_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("HISTORY_SEED=%s: %v", v, err)
		}
		only, one = n, true
	}
	for _, storeName := range []string{"memory", "file", "redis", "postgres"} {
		t.Run(storeName, func(t *testing.T) {
			pgDSN := ""
			if storeName == "postgres" {
				pgDSN = sharedPostgres(t).DSN()
			}
			start := time.Now()
			var played, failed atomic.Int64
			sem := make(chan struct{}, parallel)
			var wg sync.WaitGroup
			for i := range budget {
				if one && i > 0 || long > 0 && time.Since(start) > long {
					break
				}
				seed := base + uint64(i)
				if one {
					seed = only
				}
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
						h := generate(seed, storeName)
						if failures := playAndCheck(t, h, pgDSN); failures != "" {
							failed.Add(1)
							msg := fmt.Sprintf("HISTORY_SEED=%d go test -run 'TestHistories/%s' violates the model:\n%s", seed, storeName, failures)
							if small := shrink(t, h, pgDSN); small != "" {
								msg += "the smallest history found that still fails:\n" + small
							}
							t.Error(msg)
							if long > 0 {
								fmt.Println(msg) // at once: a long run may end before the test prints it
							}
						}
						played.Add(1)
					})
				})
			}
			wg.Wait()
			msg := fmt.Sprintf("%s: played %d histories in %v, %d violated the model", storeName, played.Load(),
				time.Since(start).Round(time.Second), failed.Load())
			t.Log(msg)
			if long > 0 {
				fmt.Println(msg)
			}
		})
	}
}

// historiesPerStore is CI's budget: about 20 seconds a store.
const historiesPerStore = 12

// playAndCheck plays h and returns its report if the model finds a
// violation, else "".
func playAndCheck(t *testing.T, h *history, pgDSN string) string {
	run, err := play(t, h, pgDSN)
	if err != nil {
		t.Fatalf("playing %s: %v", h, err)
	}
	failures := newModel(run).check()
	if len(failures) == 0 {
		return ""
	}
	out := ""
	for _, f := range failures {
		out += "  " + f + "\n"
	}
	return out + run.report()
}

// shrink drops faults, keys and requests from h while it still fails, and
// returns the report of the smallest failing history, or "" if none fails
// again. Each candidate is played twice: timing varies between plays.
func shrink(t *testing.T, h *history, pgDSN string) string {
	fails := func(c *history) string {
		for range 2 {
			if r := playAndCheck(t, c, pgDSN); r != "" {
				return r
			}
		}
		return ""
	}
	last := ""
	for tries := 0; tries < 30; {
		progress := false
		for _, c := range smaller(h) {
			tries++
			if r := fails(c); r != "" {
				h, last, progress = c, r, true
				break
			}
		}
		if !progress {
			break
		}
	}
	return last
}

// smaller lists the histories with one fault, key or request less than h.
func smaller(h *history) []*history {
	var out []*history
	for i := range h.faults {
		c := *h
		c.faults = append(append([]histFault(nil), h.faults[:i]...), h.faults[i+1:]...)
		out = append(out, &c)
	}
	for i := range h.keys {
		if len(h.keys) == 1 {
			break
		}
		c := *h
		c.keys = append(append([]histKey(nil), h.keys[:i]...), h.keys[i+1:]...)
		out = append(out, &c)
	}
	for i, k := range h.keys {
		for j := range k.reqs {
			if len(k.reqs) == 1 {
				break
			}
			c := *h
			c.keys = append([]histKey(nil), h.keys...)
			c.keys[i].reqs = append(append([]histRequest(nil), k.reqs[:j]...), k.reqs[j+1:]...)
			out = append(out, &c)
		}
	}
	return out
}
