package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestServerErrorsAreNotStoredClientErrorsAre(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		var status atomic.Int64
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(int(status.Load()))
			w.Write([]byte("answer"))
			return nil
		}}
		status.Store(503)
		wantStatus(t, do(h, b, post("/p", "k5", "x")), 503)
		status.Store(502)
		wantStatus(t, do(h, b, post("/p", "k5", "x")), 502)
		status.Store(404)
		wantStatus(t, do(h, b, post("/p", "k5", "x")), 404) // runs: 5xx released the claim
		status.Store(201)
		r := do(h, b, post("/p", "k5", "x"))
		wantStatus(t, r, 404) // the 4xx was stored
		if r.Header().Get("Idempotent-Replayed") != "true" || r.Body.String() != "answer" {
			t.Fatalf("4xx not replayed: %v %q", r.Header(), r.Body)
		}
		if n := b.runs.Load(); n != 3 {
			t.Fatalf("backend ran %d times, want 3 (two 5xx, then the 404)", n)
		}
	})
}

func TestHandlerErrorReleasesClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		fail := true
		b := &backend{}
		failing := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if fail {
				b.runs.Add(1)
				return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp: connection refused"))
			}
			return b.ServeHTTP(w, r)
		})
		if r := do(h, failing, post("/p", "k", "x")); r.err == nil {
			t.Fatal("the handler error was swallowed")
		}
		fail = false
		wantStatus(t, do(h, failing, post("/p", "k", "x")), 201)
		if n := b.runs.Load(); n != 2 {
			t.Fatalf("backend ran %d times, want 2", n)
		}
	})
}

// goneWriter is a client that hung up after the headers: every body write
// fails, as it does on a closed connection.
type goneWriter struct {
	*httptest.ResponseRecorder
}

func (g goneWriter) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

func TestClientDisconnectDoesNotLoseTheResult(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		clientGone := make(chan struct{})
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			<-clientGone // the work finishes after the client left
			if err := r.Context().Err(); err != nil {
				t.Errorf("upstream context cancelled with the client: %v", err)
			}
			w.WriteHeader(201)
			for range 4 {
				// like reverse_proxy: a failed write would abort the copy
				if _, err := w.Write([]byte("part;")); err != nil {
					return err
				}
			}
			return nil
		}}
		ctx, cancel := context.WithCancel(context.Background())
		req := post("/pay", "pay-1", `{"amount":100}`).WithContext(ctx)
		repl := caddy.NewReplacer()
		req = req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
		done := make(chan error)
		go func() {
			done <- h.ServeHTTP(goneWriter{httptest.NewRecorder()}, req, b)
		}()
		waitFor(t, func() bool { return b.runs.Load() == 1 })
		cancel()
		close(clientGone)
		if err := <-done; err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}
		r := do(h, b, post("/pay", "pay-1", `{"amount":100}`))
		wantStatus(t, r, 201)
		if r.Body.String() != "part;part;part;part;" || r.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry got %q %v, want the whole stored response", r.Body, r.Header())
		}
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

func TestHungUpstreamIsCancelledOneLeaseAfterTheClientLeft(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	cancelled := make(chan time.Time, 1)
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		<-r.Context().Done() // hangs until the handler gives up on it
		cancelled <- time.Now()
		// what reverse_proxy does when its request is cancelled
		w.WriteHeader(statusClientClosed)
		return nil
	}}
	ctx, leave := context.WithCancel(context.Background())
	req, _ := withReplacer(post("/p", "k", "x").WithContext(ctx))
	go h.ServeHTTP(httptest.NewRecorder(), req, b)
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	left := time.Now()
	leave()
	select {
	case at := <-cancelled:
		if d := at.Sub(left); d < 900*time.Millisecond || d > 3*time.Second {
			t.Fatalf("upstream cancelled %v after the client left, want one lock_timeout (1s)", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hung upstream was never cancelled after its client left")
	}
	// The failed attempt released the claim: the retry runs.
	b.serve = nil
	waitFor(t, func() bool { return do(h, b, post("/p", "k", "x")).Code == 201 })
}

func TestPanicAfterHeadersIsNeverRunAgain(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(200)
			w.Write([]byte("half"))
			panic(http.ErrAbortHandler) // reverse_proxy: the upstream broke mid-body
		}}
		func() {
			defer func() {
				if p := recover(); p != http.ErrAbortHandler {
					t.Fatalf("panic %v was not re-raised", p)
				}
			}()
			do(h, b, post("/p", "k", "x"))
		}()
		r := do(h, b, post("/p", "k", "x"))
		wantProblem(t, r, 409, "The response for this Idempotency-Key cannot be replayed")
		if b.runs.Load() != 1 {
			t.Fatal("a request whose upstream answered ran again")
		}
	})
}

func TestPanicBeforeHeadersReleases(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{serve: func(http.ResponseWriter, *http.Request) error { panic("boom") }}
	func() {
		defer func() { recover() }()
		do(h, b, post("/p", "k", "x"))
	}()
	b.serve = nil
	wantStatus(t, do(h, b, post("/p", "k", "x")), 201)
}

func TestSlowRequestKeepsItsClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
		b := &backend{blockers: make(chan struct{})}
		done := make(chan response)
		go func() { done <- do(h, b, post("/slow", "k", "x")) }()
		waitFor(t, func() bool { return b.runs.Load() == 1 })
		// Duplicates keep arriving for three leases: the renewals must hold.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			wantStatus(t, do(h, b, post("/slow", "k", "x")), 409)
		}
		close(b.blockers)
		wantStatus(t, <-done, 201)
		wantStatus(t, do(h, b, post("/slow", "k", "x")), 201)
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("backend ran %d times, want 1", n)
		}
	})
}

func TestDeadOwnersClaimIsTakenOver(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
		b := &backend{}
		// A request on another instance claimed the key and died: nobody
		// renews or completes it.
		req := post("/orders", "k", "x")
		key := store.NewKey("", "k")
		dead := &store.Claim{Token: storetest.NewToken(), Endpoint: defaultEndpointOf(req.Method, req.Host, req.URL.Path), Fingerprint: fingerprint("", bytes.NewBufferString("x")), Lease: time.Second}
		if rec, err := h.store.Acquire(context.Background(), key, dead); rec != nil || err != nil {
			t.Fatalf("dead owner's claim: %v %v", rec, err)
		}
		start := time.Now()
		wantStatus(t, do(h, b, post("/orders", "k", "x")), 409)
		for do(h, b, post("/orders", "k", "x")).Code == 409 {
			if time.Since(start) > 5*time.Second {
				t.Fatal("dead owner's claim was never taken over")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if took := time.Since(start); took < 900*time.Millisecond {
			t.Fatalf("claim taken over after %v, before its 1s lease", took)
		}
		if b.runs.Load() != 1 {
			t.Fatalf("backend ran %d times after the takeover, want 1", b.runs.Load())
		}
		// The dead owner, waking up, cannot overwrite the new owner's result.
		if err := h.store.Complete(context.Background(), key, dead, &store.Record{Status: 500}, time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("stale owner's Complete = %v, want ErrNotOwner", err)
		}
		wantStatus(t, do(h, b, post("/orders", "k", "x")), 201)
	})
}

func TestStoreOutage(t *testing.T) {
	srv := testredis.Start(t)
	raw := json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`)
	closed := provision(t, raw, nil)
	closedLogs := observe(closed)
	open := provision(t, raw, func(h *Handler) { h.OnStoreError = failOpen })
	openLogs := observe(open)
	b := &backend{}
	secretKey, secretBody := "secret-key-1234", `{"card":"4242424242424242"}`

	wantStatus(t, do(closed, b, post("/p", "before", "x")), 201)
	srv.Kill()

	r := do(closed, b, post("/p", secretKey, secretBody))
	wantProblem(t, r, 503, "Idempotency store unavailable")
	if r.Header().Get("Retry-After") == "" || r.placeholder("http.idempotency.result") != "error" {
		t.Fatalf("503 without Retry-After or error result: %v", r.Header())
	}
	if b.runs.Load() != 1 {
		t.Fatal("fail_closed ran the request while the store was down")
	}
	wantStatus(t, do(open, b, post("/p", secretKey, secretBody)), 201)
	if b.runs.Load() != 2 {
		t.Fatal("fail_open did not pass the request through")
	}
	for _, logs := range []any{closedLogs.All(), openLogs.All()} {
		text, _ := json.Marshal(logs)
		if strings.Contains(string(text), secretKey) || strings.Contains(string(text), "4242") {
			t.Fatalf("a raw key or body reached the logs: %s", text)
		}
	}
	if closedLogs.Len() == 0 || openLogs.Len() == 0 {
		t.Fatal("the outage was not logged")
	}

	srv.Restart(t)
	// Recovery needs no restart of Caddy: the next request just works.
	waitFor(t, func() bool { return do(closed, b, post("/p", "after", "x")).Code == 201 })
	wantStatus(t, do(closed, b, post("/p", "after", "x")), 201)
	if got := do(closed, b, post("/p", "after", "x")); got.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay after recovery")
	}
}

// The store is unreachable at the moment the response is to be stored, and
// back within the lease: the response is stored in the background, and
// the retry is a replay instead of a second execution.
func TestResponseStoredOnceTheStoreRecovers(t *testing.T) {
	srv := testredis.Start(t)
	proxy := faultproxy.Start(t, srv.Addr())
	h := provision(t, json.RawMessage(`{"module":"redis","addresses":["`+proxy.Addr()+`"],"read_timeout":"200ms","dial_timeout":"200ms","write_timeout":"200ms"}`),
		func(h *Handler) { h.LockTimeout = caddy.Duration(5 * time.Second) })
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		proxy.Blackhole(true) // the store goes away while the upstream works
		proxy.Cut()
		w.WriteHeader(201)
		w.Write([]byte("paid"))
		return nil
	}}
	wantStatus(t, do(h, b, post("/pay", "k", "x")), 201)
	time.Sleep(500 * time.Millisecond)
	proxy.Blackhole(false)
	b.serve = nil
	var r response
	waitFor(t, func() bool {
		r = do(h, b, post("/pay", "k", "x"))
		return r.Code != 409 && r.Code != 503
	})
	if r.Code != 201 || r.Body.String() != "paid" || r.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the store recovered got %d %q %v, want the stored response", r.Code, r.Body, r.Header())
	}
	if n := b.runs.Load(); n != 1 {
		t.Fatalf("backend ran %d times, want 1", n)
	}
}
