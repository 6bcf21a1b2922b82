package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// The failures here happen between Caddy's own reverse_proxy, provisioned
// in process, and real upstream servers: what the handler learns of them
// is what reverse_proxy makes of them.

// reverseProxy provisions reverse_proxy to the upstreams at dial (none:
// no upstream is available), with extra members of its http transport's
// JSON (e.g. `"response_header_timeout": "200ms"`), as the next handler.
func reverseProxy(t *testing.T, transport string, dial ...string) caddyhttp.Handler {
	t.Helper()
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	t.Cleanup(cancel)
	if transport != "" {
		transport = "," + transport
	}
	rp := &reverseproxy.Handler{TransportRaw: json.RawMessage(`{"protocol":"http"` + transport + `}`)}
	for _, d := range dial {
		rp.Upstreams = append(rp.Upstreams, &reverseproxy.Upstream{Dial: d})
	}
	if err := rp.Provision(ctx); err != nil {
		t.Fatalf("provisioning reverse_proxy: %v", err)
	}
	end := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return rp.ServeHTTP(w, r, end)
	})
}

// serve runs req through h in front of next, prepared as Caddy's server
// prepares a request (reverse_proxy reads its variables); before, if set,
// runs first on the prepared request.
func serve(h *Handler, next caddyhttp.Handler, req *http.Request, before func(w http.ResponseWriter, r *http.Request)) response {
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	req = caddyhttp.PrepareRequest(req, repl, w, &caddyhttp.Server{})
	if before != nil {
		before(httptest.NewRecorder(), req)
	}
	err := h.ServeHTTP(w, req, next)
	return response{w, repl, err}
}

// origin is an upstream server that counts the requests it receives.
type origin struct {
	*httptest.Server
	runs atomic.Int64
}

func startOrigin(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *origin {
	o := &origin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.runs.Add(1)
		answer(w, r)
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *origin) addr() string { return o.Listener.Addr().String() }

// hangUp reads the request and closes the connection without an answer.
func hangUp(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// stall answers only after its client has given up. It reads the body
// first: net/http notices a closed connection only once it has.
func stall(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
	w.WriteHeader(http.StatusCreated)
}

func created(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"paid":true}`))
}

const unknownTitle = "The outcome of the request for this Idempotency-Key is unknown"

func wantHandlerError(t *testing.T, r response, status int) {
	t.Helper()
	var herr caddyhttp.HandlerError
	if !errors.As(r.err, &herr) || herr.StatusCode != status {
		t.Fatalf("handler returned %v, want the %d error that Caddy answers", r.err, status)
	}
}

// The upstream got the request and no answer came back: keep holds the
// key, release lets the retry run again.
func TestUnknownOutcome(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		for _, tc := range []struct {
			name      string
			answer    func(http.ResponseWriter, *http.Request)
			transport string
			status    int
		}{
			{"connection closed after the request", hangUp, "", http.StatusBadGateway},
			{"response_header_timeout", stall, `"response_header_timeout":"200ms"`, http.StatusGatewayTimeout},
		} {
			for _, opt := range []string{app.UnknownRelease, app.UnknownKeep} {
				t.Run(tc.name+"/"+opt, func(t *testing.T) {
					h := provision(t, raw, func(h *Handler) { h.OnUnknownOutcome = opt })
					o := startOrigin(t, tc.answer)
					next := reverseProxy(t, tc.transport, o.addr())

					key := strconv.Itoa(tc.status) + "-" + opt
					first := serve(h, next, post("/pay", key, `{"amount":100}`), nil)
					wantHandlerError(t, first, tc.status)
					if got := first.placeholder("http.idempotency.result"); got != "new" {
						t.Fatalf("first request's result %q, want new", got)
					}
					retry := serve(h, next, post("/pay", key, `{"amount":100}`), nil)
					if opt == app.UnknownRelease {
						wantHandlerError(t, retry, tc.status)
						if n := o.runs.Load(); n != 2 {
							t.Fatalf("upstream got %d requests, want 2: release lets the retry run", n)
						}
						return
					}
					wantProblem(t, retry, http.StatusBadGateway, unknownTitle)
					if got := retry.placeholder("http.idempotency.result"); got != "unknown" {
						t.Fatalf("retry's result %q, want unknown", got)
					}
					if n := o.runs.Load(); n != 1 {
						t.Fatalf("upstream got %d requests, want 1: keep must not run the retry", n)
					}
					// Another payload is still another request.
					wantProblem(t, serve(h, next, post("/pay", key, `{"amount":5}`), nil), 422, "Idempotency-Key is already used")
				})
			}
		}
	})
}

// A request that reached no upstream is released even with keep: the
// retry runs, and the upstream runs once.
func TestNeverReachedIsReleased(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.OnUnknownOutcome = app.UnknownKeep })

		t.Run("closed port, open at the retry", func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			next := reverseProxy(t, "", addr)
			first := serve(h, next, post("/pay", "closed", "x"), nil)
			wantHandlerError(t, first, http.StatusBadGateway)
			if !errors.As(first.err, new(reverseproxy.DialError)) {
				t.Fatalf("reverse_proxy's error %v is not a DialError", first.err)
			}

			if l, err = net.Listen("tcp", addr); err != nil {
				t.Fatalf("listening again on %s: %v", addr, err)
			}
			o := &origin{Server: httptest.NewUnstartedServer(nil)}
			o.Listener.Close()
			o.Listener = l
			o.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { o.runs.Add(1); created(w, r) })
			o.Start()
			t.Cleanup(o.Close)
			wantStatus(t, serve(h, next, post("/pay", "closed", "x"), nil), http.StatusCreated)
			if n := o.runs.Load(); n != 1 {
				t.Fatalf("upstream ran %d times, want 1", n)
			}
		})

		working := reverseProxy(t, "", startOrigin(t, created).addr())
		for _, tc := range []struct {
			name   string
			key    string
			next   caddyhttp.Handler
			before func(w http.ResponseWriter, r *http.Request)
			status int
		}{
			{"no upstream available", "none", reverseProxy(t, ""), nil, http.StatusServiceUnavailable},
			// forward_auth is a reverse_proxy that runs before this handler,
			// a GET without the body, and leaves its upstream in the same
			// placeholders.
			{"no upstream available after forward_auth", "auth", reverseProxy(t, ""), func(w http.ResponseWriter, r *http.Request) {
				auth := r.Clone(r.Context())
				auth.Method, auth.Body, auth.ContentLength = http.MethodGet, http.NoBody, 0
				if err := working.ServeHTTP(w, auth); err != nil {
					t.Fatalf("the earlier reverse_proxy: %v", err)
				}
			}, http.StatusServiceUnavailable},
			{"another handler failed", "other", caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				return caddyhttp.Error(http.StatusInternalServerError, errors.New("template failed"))
			}), nil, http.StatusInternalServerError},
		} {
			t.Run(tc.name, func(t *testing.T) {
				first := serve(h, tc.next, post("/pay", tc.key, "x"), tc.before)
				wantHandlerError(t, first, tc.status)
				if tc.before != nil {
					// The earlier upstream's placeholder is as it left it.
					if v, _ := first.repl.Get(upstreamPlaceholder); v == nil || caddy.ToString(v) == "" {
						t.Fatalf("placeholder %s = %#v after the request", upstreamPlaceholder, v)
					} else if _, ok := v.(string); !ok {
						t.Fatalf("placeholder %s left wrapped: %#v", upstreamPlaceholder, v)
					}
				}
				wantStatus(t, serve(h, working, post("/pay", tc.key, "x"), nil), http.StatusCreated)
			})
		}
	})
}

// reverse_proxy writes 499 when the work is cancelled, one lease after its
// client left, before the upstream answered: the outcome is unknown.
func TestWorkCancelledAfterClientLeftIsUnknown(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) {
			h.OnUnknownOutcome = app.UnknownKeep
			h.LockTimeout = caddy.Duration(time.Second)
		})
		o := startOrigin(t, stall)
		next := reverseProxy(t, "", o.addr())
		ctx, leave := context.WithCancel(context.Background())
		done := make(chan response, 1)
		go func() { done <- serve(h, next, post("/pay", "left", "x").WithContext(ctx), nil) }()
		waitFor(t, func() bool { return o.runs.Load() == 1 })
		leave()
		var first response
		select {
		case first = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the work was not cancelled within 10s of its client leaving")
		}
		if first.err != nil || first.Code != statusClientClosed {
			t.Fatalf("first request: %d, %v; want reverse_proxy's 499", first.Code, first.err)
		}
		wantProblem(t, serve(h, next, post("/pay", "left", "x"), nil), http.StatusBadGateway, unknownTitle)
		if n := o.runs.Load(); n != 1 {
			t.Fatalf("upstream got %d requests, want 1", n)
		}
	})
}

// With store_server_errors, the upstream's 5xx is the answer, stored and
// replayed like any other.
func TestServerErrorsStored(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.StoreServerErrors = true })
		o := startOrigin(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte("ledger unavailable"))
		})
		next := reverseProxy(t, "", o.addr())
		first := serve(h, next, post("/pay", "k", "x"), nil)
		wantStatus(t, first, http.StatusInternalServerError)
		retry := serve(h, next, post("/pay", "k", "x"), nil)
		wantStatus(t, retry, http.StatusInternalServerError)
		if retry.Header().Get("Idempotent-Replayed") != "true" || retry.Body.String() != "ledger unavailable" {
			t.Fatalf("retry got %v %q, want the 500 replayed", retry.Header(), retry.Body)
		}
		if n := o.runs.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	})
}
