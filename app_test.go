package idempotency

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

func TestAdaptGlobalDefaults(t *testing.T) {
	caddytest.AssertAdapt(t, `{
	idempotency {
		ttl 48h
		endpoint {method} {host}{path}
		scope {header.X-Tenant}
		on_store_error fail_open
		on_unknown_outcome keep
		store_server_errors
		store memory {
			max_entries 500
		}
	}
}
:8080 {
	idempotency {
		required
	}
	respond "ok"
}`, "caddyfile", `{
	"apps": {
		"http": {
			"servers": {
				"srv0": {
					"listen": [
						":8080"
					],
					"routes": [
						{
							"handle": [
								{
									"handler": "idempotency",
									"required": true
								},
								{
									"body": "ok",
									"handler": "static_response"
								}
							]
						}
					]
				}
			}
		},
		"idempotency": {
			"scope": "{http.request.header.X-Tenant}",
			"endpoint": "{http.request.method} {http.request.host}{http.request.uri.path}",
			"ttl": 172800000000000,
			"on_store_error": "fail_open",
			"on_unknown_outcome": "keep",
			"store_server_errors": true,
			"store": {
				"max_entries": 500,
				"module": "memory"
			}
		}
	}
}`)
}

// Three backends behind one gateway, configured once: the routes share
// the global store and defaults, and each keeps its own endpoint binding.
func TestGlobalDefaultsShareOneStore(t *testing.T) {
	var runs atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s run %d", r.URL.Path, runs.Add(1))
	}))
	defer upstream.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9582
	https_port 9545
	grace_period 1ns
	idempotency {
		ttl 1h
		replay_header X-Gateway-Replay
		store memory
	}
}
http://localhost:9582 {
	route /orders* {
		idempotency
		reverse_proxy %[1]s
	}
	route /payments* {
		idempotency {
			required
			scope {http.request.header.X-Tenant}
		}
		reverse_proxy %[1]s
	}
	route /refunds* {
		idempotency {
			replay_header X-Refund-Replay
		}
		reverse_proxy %[1]s
	}
}`, upstream.Listener.Addr()), "caddyfile")

	send := func(path, key, tenant string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9582"+path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		req.Header.Set("X-Tenant", tenant)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}

	first, body := send("/orders", "k1", "")
	again, replay := send("/orders", "k1", "")
	if first.StatusCode != 200 || again.Header.Get("X-Gateway-Replay") != "true" || replay != body {
		t.Fatalf("orders: %d %q then %v %q", first.StatusCode, body, again.Header, replay)
	}
	// The same key on another route of the shared store: bound to /orders.
	if resp, _ := send("/refunds", "k1", ""); resp.StatusCode != 422 {
		t.Fatalf("key of /orders reused on /refunds: %d, want 422 from the shared store", resp.StatusCode)
	}
	if resp, _ := send("/payments", "", "acme"); resp.StatusCode != 400 {
		t.Fatalf("payments without a key: %d, want 400 (required)", resp.StatusCode)
	}
	_, acme := send("/payments", "p1", "acme")
	_, globex := send("/payments", "p1", "globex")
	if acme == globex {
		t.Fatalf("tenants shared a key: %q", acme)
	}
	send("/refunds", "r1", "")
	if resp, _ := send("/refunds", "r1", ""); resp.Header.Get("X-Refund-Replay") != "true" {
		t.Fatalf("route's own replay_header lost: %v", resp.Header)
	}
	if n := runs.Load(); n != 4 {
		t.Fatalf("upstream ran %d times, want 4", n)
	}
}

// A route takes on_unknown_outcome from the global option unless it sets
// its own; store_server_errors can be turned on by either.
func TestRoutesInheritOutcomeOptions(t *testing.T) {
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"on_unknown_outcome":"keep","store_server_errors":true}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		own        Handler
		outcome    string
		storeFiveX bool
	}{
		{Handler{}, app.UnknownKeep, true},
		{Handler{Options: app.Options{OnUnknownOutcome: app.UnknownRelease}}, app.UnknownRelease, true},
	} {
		ctx, cancel := caddy.NewContext(base)
		h := tc.own
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		if h.OnUnknownOutcome != tc.outcome || h.StoreServerErrors != tc.storeFiveX {
			t.Errorf("route %+v: on_unknown_outcome %q, store_server_errors %t; want %q, %t",
				tc.own, h.OnUnknownOutcome, h.StoreServerErrors, tc.outcome, tc.storeFiveX)
		}
		cancel()
	}
}

// release_statuses comes from the app's defaults unless a route lists its
// own, which replaces the list.
func TestRoutesInheritReleaseStatuses(t *testing.T) {
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"release_statuses":[429]}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		own  []int
		want []int
	}{
		{nil, []int{429}},
		{[]int{409, 503}, []int{409, 503}},
	} {
		ctx, cancel := caddy.NewContext(base)
		h := Handler{Options: app.Options{ReleaseStatuses: tc.own}}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(h.ReleaseStatuses, tc.want) {
			t.Errorf("route with %v: release_statuses %v, want %v", tc.own, h.ReleaseStatuses, tc.want)
		}
		cancel()
	}
}

// The protocol options of the idempotency app are every route's defaults;
// a route's own value wins, and the key's place goes whole.
func TestRoutesInheritProtocolOptions(t *testing.T) {
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"key_from":{"json":"/idempotency_key"},"problem_base":"https://docs.example.com/idem",` +
			`"expiry_header":"Idempotency-Expires","replay_header_always":true,"min_key_length":16,` +
			`"scope_challenge":"Basic realm=\"api\"","fingerprint":"json","fingerprint_only":["/amount"]}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	provisioned := func(own Handler) Handler {
		ctx, cancel := caddy.NewContext(base)
		t.Cleanup(cancel)
		if err := own.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if err := own.Validate(); err != nil {
			t.Fatal(err)
		}
		return own
	}
	h := provisioned(Handler{})
	if h.KeyFrom == nil || h.KeyFrom.JSON != "/idempotency_key" || h.ProblemBase != "https://docs.example.com/idem" ||
		h.ExpiryHeader != "Idempotency-Expires" || !h.ReplayHeaderAlways || h.MinKeyLength != 16 ||
		h.ScopeChallenge != `Basic realm="api"` || len(h.FingerprintOnly) != 1 {
		t.Errorf("the defaults were not inherited: %+v", h.Options)
	}
	own := provisioned(Handler{Options: app.Options{KeyHeader: "X-Key", MinKeyLength: 8, Fingerprint: fingerprint.JSON, FingerprintIgnore: []string{"/ts"}}})
	if own.KeyFrom != nil || own.KeyHeader != "X-Key" || own.MinKeyLength != 8 || len(own.FingerprintOnly) != 0 {
		t.Errorf("a route's own options lost to the defaults: %+v", own.Options)
	}
}
