package idempotency

import (
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// A waiter that claims the key after waiting longer than lock_timeout
// owns a fresh lease, counted from the Acquire that won, not from its
// arrival: it renews it while it runs, so a third request waits for its
// answer instead of taking the key over beside it.
func TestWaiterThatWaitedPastItsLeaseKeepsItsClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) {
			h.LockTimeout = caddy.Duration(time.Second)
			waiting(10 * time.Second)(h)
		})
		var running, most, runs atomic.Int64
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			n := runs.Add(1)
			now := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			if n == 1 {
				time.Sleep(1500 * time.Millisecond)
				w.WriteHeader(http.StatusBadGateway) // released: the waiter runs
				return nil
			}
			time.Sleep(3 * time.Second)
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("order " + string(rune('0'+n))))
			return nil
		}}
		var wg sync.WaitGroup
		results := make([]response, 3)
		for i, at := range []time.Duration{0, 50 * time.Millisecond, 2650 * time.Millisecond} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(at)
				results[i] = do(h, b, post("/orders", "lease-clock", `{"amount":100}`))
			}()
		}
		wg.Wait()
		wantStatus(t, results[0], http.StatusBadGateway)
		wantStatus(t, results[1], http.StatusCreated)
		wantStatus(t, results[2], http.StatusCreated)
		if got := results[2].Header().Get("Idempotent-Replayed"); got != "true" {
			t.Errorf("the third request was answered without the replay header (%q): it ran beside the waiter", got)
		}
		if runs.Load() != 2 || most.Load() != 1 {
			t.Errorf("the upstream ran %d times, at most %d at once; want 2 runs, one at a time", runs.Load(), most.Load())
		}
	})
}
