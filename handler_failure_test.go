package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
