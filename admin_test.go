package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// adminServer serves a's routes as Caddy's admin endpoint does, errors
// included: an APIError's status, and {"error": message}.
func adminServer(t *testing.T, a *adminAPI) *httptest.Server {
	t.Helper()
	routes := a.Routes()
	if len(routes) != 1 || routes[0].Pattern != "/idempotency/" {
		t.Fatalf("routes %+v, want one for /idempotency/", routes)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(routes[0].Pattern, func(w http.ResponseWriter, r *http.Request) {
		err := routes[0].Handler.ServeHTTP(w, r)
		if err == nil {
			return
		}
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			apiErr = caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		apiErr.Message = apiErr.Err.Error()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(apiErr.HTTPStatus)
		json.NewEncoder(w).Encode(apiErr)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// call sends method path to srv, checks the status and decodes the JSON
// answer into v (if not nil); it returns the raw answer.
func call(t *testing.T, srv *httptest.Server, method, path string, status int, v any) string {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, path, body, err)
		}
	}
	return string(body)
}

// wantError checks that method path fails with status and a message that
// contains want.
func wantError(t *testing.T, srv *httptest.Server, method, path string, status int, want string) {
	t.Helper()
	var e struct{ Error string }
	call(t, srv, method, path, status, &e)
	if !strings.Contains(e.Error, want) {
		t.Fatalf("%s %s: error %q, want it to contain %q", method, path, e.Error, want)
	}
}

func approx(t *testing.T, what string, got, want, tolerance time.Duration) {
	t.Helper()
	if got < want-tolerance || got > want+tolerance {
		t.Fatalf("%s = %v, want about %v", what, got, want)
	}
}

func parseDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// The admin API sees the records the handler made, the same way on every
// store: a key's lookup by client key or by hash, its purge, and the
// listing of claims in flight.
func TestAdminOnEveryStore(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h, name := provisionNamed(t, raw, nil)
		srv := adminServer(t, &adminAPI{})
		storeQ := "&store=" + url.QueryEscape(name)
		b := &backend{}

		wantStatus(t, do(h, b, post("/orders", "order-1", `{"sku":"tea"}`)), http.StatusCreated)
		hash := store.NewKey("", "order-1").String()

		var info keyInfo
		body := call(t, srv, "GET", "/idempotency/keys/"+hash+"?"+storeQ[1:], 200, &info)
		if info.Store != name || info.Key != hash || info.State != "completed" || info.Endpoint != "POST api.example.com/orders" ||
			info.Status != 201 || info.BodySize != len(`{"order":42}`) || info.Truncated {
			t.Fatalf("lookup = %+v", info)
		}
		if strings.Contains(body, "order\\\":42") || strings.Contains(body, "X-Order") || strings.Contains(body, "eyJvcmRlciI6NDJ9") {
			t.Fatalf("lookup shows the stored response: %s", body)
		}
		approx(t, "age", parseDuration(t, info.Age), 0, time.Minute)
		approx(t, "expires_in", parseDuration(t, info.ExpiresIn), 24*time.Hour, time.Minute)
		approx(t, "expires_at", time.Until(*info.ExpiresAt), 24*time.Hour, time.Minute)
		approx(t, "created_at", time.Since(info.CreatedAt), 0, time.Minute)

		// Another scope is another key.
		wantError(t, srv, "GET", "/idempotency/keys/"+store.NewKey("bob", "order-1").String()+"?"+storeQ[1:], 404, "no record for key")

		// A claim in flight: listed as stuck once old enough, purged.
		b.blockers = make(chan struct{})
		done := make(chan response, 1)
		go func() { done <- do(h, b, post("/slow", "slow-1", "")) }()
		waitFor(t, func() bool { return b.runs.Load() == 2 })
		slow := store.NewKey("", "slow-1").String()
		info = keyInfo{}
		call(t, srv, "GET", "/idempotency/keys/"+slow+"?"+storeQ[1:], 200, &info)
		if info.State != "in_progress" || info.Endpoint != "POST api.example.com/slow" || info.Status != 0 || info.BodySize != 0 {
			t.Fatalf("lookup of a claim = %+v", info)
		}
		approx(t, "lease", parseDuration(t, info.ExpiresIn), 30*time.Second, 10*time.Second)

		var stuck stuckList
		call(t, srv, "GET", "/idempotency/stuck?older_than=0s"+storeQ, 200, &stuck)
		if stuck.Store != name || stuck.OlderThan != "0s" || stuck.Limit != defaultStuckLimit ||
			len(stuck.Claims) != 1 || stuck.Claims[0].Key != slow || stuck.Claims[0].Endpoint != "POST api.example.com/slow" ||
			stuck.Claims[0].State != "in_progress" || stuck.Claims[0].ExpiresAt == nil {
			t.Fatalf("stuck = %+v, want the one claim", stuck)
		}
		stuck = stuckList{}
		body = call(t, srv, "GET", "/idempotency/stuck?older_than=1h&limit=5"+storeQ, 200, &stuck)
		if len(stuck.Claims) != 0 || stuck.OlderThan != "1h0m0s" || stuck.Limit != 5 || !strings.Contains(body, `"claims":[]`) {
			t.Fatalf("stuck?older_than=1h = %s, want no claims", body)
		}

		var p purged
		call(t, srv, "DELETE", "/idempotency/keys/"+slow+"?"+storeQ[1:], 200, &p)
		if p != (purged{Store: name, Key: slow, Deleted: true}) {
			t.Fatalf("purge = %+v", p)
		}
		// The purged owner finishes: its client gets the answer, but the
		// store keeps nothing, and a retry runs anew.
		close(b.blockers)
		wantStatus(t, <-done, http.StatusCreated)
		wantError(t, srv, "GET", "/idempotency/keys/"+slow+"?"+storeQ[1:], 404, "no record for key "+slow)

		// Purging the completed record: the next request with its key runs.
		call(t, srv, "DELETE", "/idempotency/keys/"+hash+"?"+storeQ[1:], 200, &p)
		wantError(t, srv, "DELETE", "/idempotency/keys/"+hash+"?"+storeQ[1:], 404, "no record for key "+hash)
		wantError(t, srv, "GET", "/idempotency/keys/"+hash+"?"+storeQ[1:], 404, "no record")
		runs := b.runs.Load()
		wantStatus(t, do(h, b, post("/orders", "order-1", `{"sku":"tea"}`)), http.StatusCreated)
		if b.runs.Load() != runs+1 {
			t.Fatal("the request with a purged key did not run again")
		}
	})
}

// A request whose outcome is unknown holds its key: the operator sees it,
// checks the backend, and purges the key so that the client's retry runs.
func TestAdminOutcomeUnknown(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h, name := provisionNamed(t, raw, func(h *Handler) { h.OnUnknownOutcome = unknownKeep })
		srv := adminServer(t, &adminAPI{})
		storeQ := "?store=" + url.QueryEscape(name)
		var broken atomic.Bool
		broken.Store(true)
		o := startOrigin(t, func(w http.ResponseWriter, r *http.Request) {
			if broken.Load() {
				hangUp(w, r)
				return
			}
			created(w, r)
		})
		next := reverseProxy(t, "", o.addr())
		wantHandlerError(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusBadGateway)
		hash := store.NewKey("", "pay-1").String()

		var info keyInfo
		body := call(t, srv, "GET", "/idempotency/keys/"+hash+storeQ, 200, &info)
		if info.State != "completed" || !info.OutcomeUnknown || info.Truncated || info.Status != 0 || info.BodySize != 0 ||
			info.Endpoint != "POST api.example.com/pay" || !strings.Contains(body, `"outcome_unknown":true`) {
			t.Fatalf("lookup of an unknown outcome = %s", body)
		}
		approx(t, "expires_in", parseDuration(t, info.ExpiresIn), 24*time.Hour, time.Minute)
		wantProblem(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusBadGateway, unknownTitle)

		var p purged
		call(t, srv, "DELETE", "/idempotency/keys/"+hash+storeQ, 200, &p)
		if !p.Deleted {
			t.Fatalf("purge = %+v", p)
		}
		broken.Store(false)
		wantStatus(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusCreated)
		if n := o.runs.Load(); n != 2 {
			t.Fatalf("upstream got %d requests, want 2: the first, and the retry after the purge", n)
		}
	})
}

// plain is a store that cannot be inspected.
type plain struct{ store.Store }

func TestAdminStores(t *testing.T) {
	mem := openMemory(t)
	regs := []store.Registration{{Name: "orders", Module: "memory", Store: mem}, {Name: "legacy", Module: "other", Store: plain{mem}}}
	srv := adminServer(t, &adminAPI{stores: func() []store.Registration { return regs }})
	var got []storeInfo
	call(t, srv, "GET", "/idempotency/stores", 200, &got)
	want := []storeInfo{{Name: "orders", Module: "memory", Inspector: true}, {Name: "legacy", Module: "other", Inspector: false}}
	if !slices.Equal(got, want) {
		t.Fatalf("stores = %+v, want %+v", got, want)
	}

	// Without an injected list, the registry's stores are served.
	own := openMemory(t)
	srv = adminServer(t, &adminAPI{})
	call(t, srv, "GET", "/idempotency/stores", 200, &got)
	found := false
	for _, s := range got {
		found = found || (s.Name == own.Name && s.Module == "memory")
	}
	if !found {
		t.Fatalf("stores = %+v, want the provisioned memory store", got)
	}
}

// Which store a request means: the only one, its name, a module name that
// only one store has; anything else is refused with the names.
func TestAdminStoreChoice(t *testing.T) {
	a, b := openMemory(t), openMemory(t)
	var regs []store.Registration
	srv := adminServer(t, &adminAPI{stores: func() []store.Registration { return regs }})
	k := store.NewKey("", "k1")
	path := "/idempotency/keys/" + k.String()
	if got, err := a.Acquire(context.Background(), k, &store.Claim{Lease: time.Minute, Endpoint: "POST in/a", CreatedAt: time.Now()}); got.Record != nil || err != nil {
		t.Fatal(got.Record, err)
	}

	wantError(t, srv, "GET", path, 404, "no idempotency store is provisioned")
	wantError(t, srv, "GET", "/idempotency/stuck", 404, "no idempotency store is provisioned")

	regs = []store.Registration{{Name: "orders", Module: "memory", Store: a}}
	var info keyInfo
	call(t, srv, "GET", path, 200, &info) // the only store: store= may be left out
	if info.Store != "orders" || info.Endpoint != "POST in/a" {
		t.Fatalf("lookup in the only store = %+v", info)
	}

	regs = []store.Registration{{Name: "legacy", Module: "other", Store: plain{a}}, {Name: "memory (5 records, 1MiB)", Module: "memory", Store: b}, {Name: "orders", Module: "memory", Store: a}}
	wantError(t, srv, "GET", path, 400, "3 stores are provisioned; choose one with store=<name> (--store on the command line): legacy, memory (5 records, 1MiB), orders")
	wantError(t, srv, "GET", path+"?store=memory", 400, "2 memory stores are provisioned; choose one with its full name")
	wantError(t, srv, "GET", path+"?store=redis", 404, `no store "redis"; provisioned stores: legacy, memory (5 records, 1MiB), orders`)
	wantError(t, srv, "GET", path+"?store="+url.QueryEscape("memory (5 records, 1MiB)"), 404, "no record for key "+k.String()+" in store memory (5 records, 1MiB)")
	wantError(t, srv, "GET", path+"?store=other", 501, "store legacy cannot be inspected")
	wantError(t, srv, "GET", path+"?store=legacy", 501, "store legacy cannot be inspected")
	call(t, srv, "GET", path+"?store=orders", 200, &info)
	if info.Store != "orders" || info.Endpoint != "POST in/a" {
		t.Fatalf("lookup in the store named orders = %+v", info)
	}

	regs = []store.Registration{{Name: "orders", Module: "memory", Store: a}, {Name: "legacy", Module: "other", Store: plain{a}}}
	call(t, srv, "GET", path+"?store=memory", 200, &info) // the one memory store
	if info.Store != "orders" {
		t.Fatalf("lookup in the one memory store = %+v", info)
	}
}

func TestAdminBadRequests(t *testing.T) {
	mem := openMemory(t)
	srv := adminServer(t, &adminAPI{stores: func() []store.Registration {
		return []store.Registration{{Name: "memory", Module: "memory", Store: mem}}
	}})
	hash := store.NewKey("", "k").String()
	for _, tc := range []struct {
		method, path string
		status       int
		want         string
	}{
		{"GET", "/idempotency/keys/abc", 400, "not a key hash"},
		{"GET", "/idempotency/keys/" + strings.Repeat("zz", 32), 400, "not a key hash"},
		{"GET", "/idempotency/keys", 400, "missing key hash: use /idempotency/keys/<hash>"},
		// The raw key and scope are never taken: the admin log writes the URI.
		{"GET", "/idempotency/keys?key=k&scope=alice", 400, "the API takes a key's hash, not the key: use /idempotency/keys/<hash>"},
		{"DELETE", "/idempotency/keys/" + hash + "?key=k", 400, "the API takes a key's hash, not the key"},
		{"GET", "/idempotency/stuck?older_than=soon", 400, "older_than"},
		{"GET", "/idempotency/stuck?older_than=-1s", 400, "older_than"},
		{"GET", "/idempotency/stuck?limit=0", 400, "limit"},
		{"GET", "/idempotency/stuck?limit=10001", 400, "limit"},
		{"GET", "/idempotency/stuck?limit=many", 400, "limit"},
		{"POST", "/idempotency/keys/" + hash, 405, "method POST not allowed"},
		{"PUT", "/idempotency/keys/" + hash, 405, "use GET or DELETE"},
		{"DELETE", "/idempotency/stuck", 405, "use GET"},
		{"DELETE", "/idempotency/stores", 405, "use GET"},
		{"GET", "/idempotency/", 404, "resource not found"},
		{"GET", "/idempotency/nope", 404, "resource not found"},
		{"GET", "/idempotency/keys/" + hash + "/more", 400, "not a key hash"},
	} {
		wantError(t, srv, tc.method, tc.path, tc.status, tc.want)
	}
	// Upper-case hex is a hash as well; stuck's defaults.
	wantError(t, srv, "GET", "/idempotency/keys/"+strings.ToUpper(hash), 404, "no record for key "+hash)
	var stuck stuckList
	call(t, srv, "GET", "/idempotency/stuck", 200, &stuck)
	if stuck.OlderThan != "30s" || stuck.Limit != 100 || stuck.Claims == nil {
		t.Fatalf("stuck defaults = %+v", stuck)
	}
	call(t, srv, "GET", "/idempotency/stuck?older_than=1d", 200, &stuck) // Caddy's day unit
	if stuck.OlderThan != "24h0m0s" {
		t.Fatalf("older_than=1d = %q", stuck.OlderThan)
	}
}

// A store that cannot be reached answers 503, as the handler does.
func TestAdminStoreUnavailable(t *testing.T) {
	redisSrv := testredis.Start(t)
	_, name := provisionNamed(t, json.RawMessage(`{"module":"redis","addresses":["`+redisSrv.Addr()+`"],"dial_timeout":"200ms","read_timeout":"200ms"}`), nil)
	srv := adminServer(t, &adminAPI{})
	redisSrv.Kill()
	q := "store=" + url.QueryEscape(name)
	k := "/idempotency/keys/" + store.NewKey("", "k").String() + "?"
	wantError(t, srv, "GET", k+q, 503, "idempotency store unavailable")
	wantError(t, srv, "DELETE", k+q, 503, "deleting in store "+name)
	wantError(t, srv, "GET", "/idempotency/stuck?"+q, 503, "listing claims in store "+name)
}

func TestAdminModule(t *testing.T) {
	mod, err := caddy.GetModule("admin.api.idempotency")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mod.New().(caddy.AdminRouter); !ok {
		t.Fatal("admin.api.idempotency is not an AdminRouter")
	}
}
