package idempotency

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// Behind forward_auth, {http.auth.user.id} is empty: only caddyauth
// providers set it. The recipe copies the auth service's user header and
// scopes by it; require_scope refuses what would share the empty scope,
// a client's forged copy of the header included.
func TestForwardAuthScope(t *testing.T) {
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch user := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); user {
		case "alice", "bob":
			w.Header().Set("X-User-Id", user)
		case "service": // authenticated, but the auth service names no user
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer auth.Close()
	var runs atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %q", n, r.Header.Get("X-User-Id"))
	}))
	defer app.Close()

	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9716
	https_port 9746
	grace_period 1ns
}
http://localhost:9716 {
	route {
		request_header -X-User-Id
		forward_auth %[1]s {
			uri /check
			copy_headers X-User-Id
		}
		route /default/* {
			idempotency {
				require_scope
				store memory
			}
			reverse_proxy %[2]s
		}
		route /orders/* {
			idempotency {
				scope {http.request.header.X-User-Id}
				require_scope
				store memory
			}
			reverse_proxy %[2]s
		}
	}
}`, auth.Listener.Addr(), app.Listener.Addr()), "caddyfile")

	send := func(path, user, key string, header map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9716"+path, strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Authorization", "Bearer "+user)
		req.Header.Set("Idempotency-Key", key)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	wantRefused := func(resp *http.Response, body string) {
		t.Helper()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(body, `"type":"`+docsURL+`missing-scope"`) {
			t.Fatalf("got %d %s %s, want the 401 missing-scope problem", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}

	// The default scope is empty behind forward_auth: refused, not shared.
	wantRefused(send("/default/x", "alice", "k1", nil))

	// The recipe: one scope per user.
	resp, alices := send("/orders/x", "alice", "k1", nil)
	if resp.StatusCode != http.StatusCreated || alices != `order 1 for "alice"` {
		t.Fatalf("alice got %d %q", resp.StatusCode, alices)
	}
	_, bobs := send("/orders/x", "bob", "k1", nil)
	if bobs != `order 2 for "bob"` {
		t.Fatalf("bob got %q: users share keys", bobs)
	}
	resp, again := send("/orders/x", "alice", "k1", nil)
	if again != alices || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry got %q, want her replay", again)
	}

	// The client's own copy of the header is deleted before forward_auth
	// (which keeps it before Caddy v2.11.9); with no user from the auth
	// service the scope is empty, and refused.
	wantRefused(send("/orders/x", "service", "k1", map[string]string{"X-User-Id": "alice"}))
	if runs.Load() != 2 {
		t.Fatalf("the upstream ran %d times, want 2", runs.Load())
	}
}

// Without require_scope, a scope that expands empty is logged once per
// handler, not once per request.
func TestEmptyScopeIsLoggedOnce(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	logs := watchLogs(h)
	b := &backend{}
	for _, key := range []string{"a", "b", "c"} {
		wantStatus(t, do(h, b, post("/p", key, "x")), http.StatusCreated)
	}
	if n := logs.FilterMessageSnippet("scope").Len(); n != 1 {
		t.Fatalf("%d log entries about the empty scope, want 1: %v", n, logs.All())
	}
	entry := logs.FilterMessageSnippet("scope").All()[0]
	if entry.ContextMap()["scope"] != app.DefaultScope {
		t.Fatalf("the entry names scope %v, want the template %s", entry.ContextMap()["scope"], app.DefaultScope)
	}
}

func TestRequireScopeRefusesTheEmptyScope(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.Scope = "{http.request.header.X-Tenant}"
		h.RequireScope = true
	})
	b := &backend{}
	r := do(h, b, post("/p", "k", "x"))
	wantProblem(t, r, http.StatusUnauthorized, "The caller of this Idempotency-Key is unknown")
	if got := r.placeholder("http.idempotency.result"); got != "missing_scope" {
		t.Fatalf("result %q, want missing_scope", got)
	}
	req := post("/p", "k", "x")
	req.Header.Set("X-Tenant", "acme")
	wantStatus(t, do(h, b, req), http.StatusCreated)
	// A keyless request on a route that does not require a key passes
	// through as before: it shares no record.
	wantStatus(t, do(h, b, post("/p", "", "x")), http.StatusCreated)
	if b.runs.Load() != 2 {
		t.Fatalf("ran %d times, want 2", b.runs.Load())
	}
}

// require_scope and forward_key in the Caddyfile, in JSON, and inherited
// from the idempotency app's defaults.
func TestScopeOptionsConfig(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n require_scope\n forward_key X-Upstream-Key\n}")); err != nil {
		t.Fatal(err)
	}
	if !h.RequireScope || h.ForwardKey != "X-Upstream-Key" {
		t.Fatalf("parsed %+v", h)
	}
	for _, tc := range []struct{ in, want string }{
		{"idempotency {\n forward_key\n}", "forward_key: expected a value"},
		{"idempotency {\n forward_key A B\n}", "forward_key: unexpected extra argument 'B'"},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
	// The value is checked once, by Validate, whichever way it came.
	for _, name := range []string{"X Y", "X:Y"} {
		bad := Handler{Options: app.Options{ForwardKey: name}}
		bad.SetDefaults()
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "forward_key") {
			t.Errorf("Validate of forward_key %q = %v", bad.ForwardKey, err)
		}
	}

	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"require_scope":true,"forward_key":"X-Upstream-Key"}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		own        Handler
		forwardKey string
	}{
		{Handler{}, "X-Upstream-Key"},
		{Handler{Options: app.Options{ForwardKey: "X-Other"}}, "X-Other"},
	} {
		ctx, cancel := caddy.NewContext(base)
		h := tc.own
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if !h.RequireScope || h.ForwardKey != tc.forwardKey {
			t.Errorf("route %+v: require_scope %t, forward_key %q; want true, %q", tc.own, h.RequireScope, h.ForwardKey, tc.forwardKey)
		}
		cancel()
	}
}
