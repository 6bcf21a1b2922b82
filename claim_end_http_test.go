package idempotency

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Answers that say the request was not carried out (a rate limit, an
// expired token) are released like a 5xx: the retry runs again.
func TestReleasedStatusesRunAgain(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		for _, status := range []int{http.StatusTooManyRequests, http.StatusUnauthorized} {
			t.Run(strconv.Itoa(status), func(t *testing.T) {
				h := provision(t, raw, nil)
				refuse := true
				o := startOrigin(t, func(w http.ResponseWriter, r *http.Request) {
					if refuse {
						w.Header().Set("Retry-After", "1")
						w.WriteHeader(status)
						w.Write([]byte("not now"))
						return
					}
					created(w, r)
				})
				next := reverseProxy(t, "", o.addr())
				key := "released-" + strconv.Itoa(status)
				wantStatus(t, serve(h, next, post("/pay", key, "x"), nil), status)
				refuse = false
				retry := serve(h, next, post("/pay", key, "x"), nil)
				wantStatus(t, retry, http.StatusCreated)
				if retry.Header().Get("Idempotent-Replayed") != "" || o.runs.Load() != 2 {
					t.Fatalf("the %d was stored: the retry got %v, the upstream ran %d times", status, retry.Header(), o.runs.Load())
				}
				// the 201 is stored as ever
				again := serve(h, next, post("/pay", key, "x"), nil)
				if again.Header().Get("Idempotent-Replayed") != "true" || o.runs.Load() != 2 {
					t.Fatalf("the 201 after the %d was not replayed", status)
				}
			})
		}
	})
}

// release_statuses replaces the default list: a 429 is then stored, a 409
// released.
func TestReleaseStatusesOption(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.ReleaseStatuses = []int{409} })
	var status int
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(status)
		return nil
	}}
	status = 409
	wantStatus(t, do(h, b, post("/p", "a", "x")), 409)
	wantStatus(t, do(h, b, post("/p", "a", "x")), 409)
	if n := b.runs.Load(); n != 2 {
		t.Fatalf("a listed 409 ran %d times, want 2 (released)", n)
	}
	status = 429
	wantStatus(t, do(h, b, post("/p", "b", "x")), 429)
	if r := do(h, b, post("/p", "b", "x")); r.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a 429 left out of release_statuses was not stored: %v", r.Header())
	}
}

// A handler that fails after the headers went out leaves a response that
// broke off: the work was done, the answer is not whole.
func TestBrokenOffResponseIsTruncated(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"order":`))
			return caddyhttp.Error(http.StatusInternalServerError, errors.New("template failed mid-body"))
		}}
		if r := do(h, b, post("/p", "k", "x")); r.err == nil {
			t.Fatal("the handler error was swallowed")
		}
		r := do(h, b, post("/p", "k", "x"))
		wantProblem(t, r, http.StatusConflict, "The response for this Idempotency-Key cannot be replayed")
		if n := b.runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want 1", n)
		}
	})
}

// Trailers set after the body, declared or with net/http's prefix, are
// stored under the prefix and replayed as trailers, by every store.
func TestTrailersAreReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, nil)
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("body"))
			w.Header().Set("X-Checksum", "c1")
			w.Header().Set(http.TrailerPrefix+"X-Undeclared", "u1")
			return nil
		}}
		wantStatus(t, do(h, b, post("/p", "k", "x")), 200)
		r := do(h, b, post("/p", "k", "x"))
		wantStatus(t, r, 200)
		res := r.Result()
		if r.Header().Get("Idempotent-Replayed") != "true" || r.Body.String() != "body" {
			t.Fatalf("not replayed: %v %q", r.Header(), r.Body)
		}
		if got := res.Trailer.Get("X-Checksum"); got != "c1" {
			t.Errorf("declared trailer replayed as %q, want c1 (trailers %v, header %v)", got, res.Trailer, r.Header())
		}
		if got := res.Trailer.Get("X-Undeclared"); got != "u1" {
			t.Errorf("prefixed trailer replayed as %q, want u1 (trailers %v)", got, res.Trailer)
		}
		if r.Header().Get("Content-Length") != "" {
			t.Errorf("a replay with trailers has Content-Length %q: HTTP/1.1 would send no trailers", r.Header().Get("Content-Length"))
		}
	})
}
