package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func waiting(max time.Duration) func(*Handler) {
	return func(h *Handler) {
		h.OnConflict = app.ConflictWait
		h.MaxWait = caddy.Duration(max)
	}
}

func TestWaitingDuplicatesGetTheReplay(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, waiting(10*time.Second))
		b := &backend{blockers: make(chan struct{})}
		owner := make(chan response)
		go func() { owner <- do(h, b, post("/orders", "w", "x")) }()
		waitFor(t, func() bool { return b.runs.Load() == 1 })

		const n = 20
		var wg sync.WaitGroup
		var answered atomic.Int64
		results := make([]response, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = do(h, b, post("/orders", "w", "x"))
				answered.Add(1)
			}()
		}
		time.Sleep(300 * time.Millisecond)
		if answered.Load() != 0 {
			t.Fatalf("%d duplicates were answered while the first request ran", answered.Load())
		}
		close(b.blockers)
		wantStatus(t, <-owner, 201)
		wg.Wait()
		for _, r := range results {
			wantStatus(t, r, 201)
			if r.Header().Get("Idempotent-Replayed") != "true" || r.placeholder("http.idempotency.result") != "replay" {
				t.Fatalf("waiter answered %v, result %q", r.Header(), r.placeholder("http.idempotency.result"))
			}
		}
		if b.runs.Load() != 1 {
			t.Fatalf("backend ran %d times, want 1", b.runs.Load())
		}
	})
}

func TestWaitEndsWith409AfterMaxWait(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), waiting(300*time.Millisecond))
	b := &backend{blockers: make(chan struct{})}
	defer close(b.blockers)
	go do(h, b, post("/orders", "w", "x"))
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	start := time.Now()
	r := do(h, b, post("/orders", "w", "x"))
	if took := time.Since(start); took < 290*time.Millisecond || took > 2*time.Second {
		t.Fatalf("waited %v, want about max_wait (300ms)", took)
	}
	wantProblem(t, r, 409, "A request is outstanding for this Idempotency-Key")
	if r.Header().Get("Retry-After") == "" {
		t.Fatal("409 after waiting has no Retry-After")
	}
}

// An owner on another instance: no in-process wake-up, the waiter must see
// the completion by polling the store.
func TestWaitNoticesAnOwnerElsewhere(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, waiting(10*time.Second))
		b := &backend{}
		req := post("/orders", "remote", "x")
		key := store.NewKey("", "remote")
		remote := &store.Claim{Token: storetest.NewToken(), Endpoint: fingerprint.Endpoint(fingerprint.DefaultEndpoint, req, nil), Fingerprint: h.payload.Of(req, []byte("x")), CreatedAt: time.Now(), Lease: time.Minute}
		if got, err := h.store.Acquire(context.Background(), key, remote); got.Record != nil || err != nil {
			t.Fatalf("remote claim: %v %v", got.Record, err)
		}
		go func() {
			time.Sleep(200 * time.Millisecond)
			h.store.Complete(context.Background(), key, remote,
				&store.Response{Status: 202, Body: []byte("done elsewhere")}, time.Minute)
		}()
		start := time.Now()
		r := do(h, b, req)
		wantStatus(t, r, 202)
		if r.Body.String() != "done elsewhere" || b.runs.Load() != 0 {
			t.Fatalf("waiter got %q with %d local runs", r.Body, b.runs.Load())
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("noticed the remote completion after %v", took)
		}
	})
}

func TestWaiterTakesOverAfterAServerError(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), waiting(10*time.Second))
	var status atomic.Int64
	status.Store(503)
	b := &backend{blockers: make(chan struct{}, 2), serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(int(status.Load()))
		return nil
	}}
	owner := make(chan response)
	go func() { owner <- do(h, b, post("/orders", "w", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	waiter := make(chan response)
	go func() { waiter <- do(h, b, post("/orders", "w", "x")) }()
	time.Sleep(100 * time.Millisecond)
	b.blockers <- struct{}{}
	wantStatus(t, <-owner, 503)
	status.Store(201)
	b.blockers <- struct{}{}
	r := <-waiter
	wantStatus(t, r, 201)
	if r.placeholder("http.idempotency.result") != "new" || b.runs.Load() != 2 {
		t.Fatalf("after the owner's 503 the waiter got result %q with %d runs", r.placeholder("http.idempotency.result"), b.runs.Load())
	}
}

func TestWaiterThatLeavesLeavesNothing(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), waiting(time.Minute))
	b := &backend{blockers: make(chan struct{})}
	defer close(b.blockers)
	go do(h, b, post("/orders", "w", "x"))
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(h, b, post("/orders", "w", "x").WithContext(ctx))
		}()
		time.AfterFunc(100*time.Millisecond, cancel)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("waiters whose clients left did not return")
	}
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before+2 })
	if n := store.Awaited(); n != 0 {
		t.Fatalf("%d watches left behind by waiters that left", n)
	}
}
