package idempotency

import (
	"context"
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

func TestAdaptFingerprintOptions(t *testing.T) {
	caddytest.AssertAdapt(t, `
:8080 {
	idempotency {
		fingerprint_ignore  /sent_at /items/*/client_ts
		fingerprint         json
		fingerprint_headers Content-Type X-Account-Id
	}
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
									"fingerprint": "json",
									"fingerprint_headers": [
										"Content-Type",
										"X-Account-Id"
									],
									"fingerprint_ignore": [
										"/sent_at",
										"/items/*/client_ts"
									],
									"handler": "idempotency"
								}
							]
						}
					]
				}
			}
		}
	}
}`)
}

func TestFingerprintCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"idempotency {\n fingerprint\n}", "fingerprint: expected a value, at Testfile:2"},
		{"idempotency {\n fingerprint xml\n}", "fingerprint: want body or json or none, got 'xml'"},
		{"idempotency {\n fingerprint json body\n}", "fingerprint: unexpected extra argument 'body'"},
		{"idempotency {\n fingerprint json\n fingerprint json\n}", "fingerprint already specified"},
		{"idempotency {\n fingerprint json\n fingerprint_ignore\n}", "fingerprint_ignore: expected at least one value"},
		{"idempotency {\n fingerprint json\n fingerprint_ignore /a\n fingerprint_ignore /b\n}", "fingerprint_ignore already specified"},
		{"idempotency {\n fingerprint_headers\n}", "fingerprint_headers: expected at least one value"},
		{"idempotency {\n fingerprint_headers A\n fingerprint_headers B\n}", "fingerprint_headers already specified"},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
	// The mode may come after the pointers.
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n fingerprint_ignore /a\n fingerprint json\n}")); err != nil {
		t.Errorf("fingerprint_ignore before fingerprint json: %v", err)
	}
}

func TestFingerprintValidate(t *testing.T) {
	for _, tc := range []struct {
		h    Handler
		want string
	}{
		{Handler{Options: app.Options{Fingerprint: "xml"}}, `fingerprint: want body, json or none, got "xml"`},
		{Handler{Options: app.Options{FingerprintIgnore: []string{"/sent_at"}}}, "fingerprint_ignore applies only with fingerprint json, not body"},
		{Handler{Options: app.Options{Fingerprint: "none", FingerprintIgnore: []string{"/sent_at"}}}, "fingerprint_ignore applies only with fingerprint json, not none"},
		{Handler{Options: app.Options{Fingerprint: "json", FingerprintIgnore: []string{"/ok", "sent_at"}}}, "fingerprint_ignore: 'sent_at' is not a JSON pointer (RFC 6901): must start with /"},
		{Handler{Options: app.Options{FingerprintHeaders: []string{"X-Ok", "X Bad"}}}, `fingerprint_headers: invalid header name "X Bad"`},
		{Handler{Options: app.Options{FingerprintHeaders: []string{""}}}, `fingerprint_headers: invalid header name ""`},
	} {
		// Provision compiles, Validate checks the rest, as Caddy calls them.
		h := tc.h
		h.StoreRaw = storeConfigs[0].raw(t)
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: Provision and Validate = %v, want %q", tc.h, err, tc.want)
		}
		// The app's defaults are checked the same way.
		global := app.App{Options: tc.h.Options}
		if err = global.Provision(ctx); err == nil {
			err = global.Validate()
		}
		if err == nil || err.Error() != "idempotency defaults: "+tc.want {
			t.Errorf("app %+v: Provision and Validate = %v, want %q", tc.h, err, tc.want)
		}
		cancel()
	}
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.Fingerprint = "json"
		h.FingerprintIgnore = []string{"/sent_at"}
	})
	req := httptest.NewRequest("POST", "/", nil)
	if h.payload.Of(req, []byte(`{"a":1,"sent_at":1}`)) != h.payload.Of(req, []byte(`{"a":1,"sent_at":2}`)) {
		t.Error("the pointers were not compiled at Provision")
	}
}

// Through a real Caddy: a retry with a fresh sent_at replays. A route takes
// the global option's fingerprint options unless it sets its own, and the
// pointers only with the json mode they belong to.
func TestFingerprintJSONInCaddy(t *testing.T) {
	var runs atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", runs.Add(1))
	}))
	defer upstream.Close()
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9590
	https_port 9553
	grace_period 1ns
	idempotency {
		fingerprint json
		fingerprint_ignore /sent_at
		fingerprint_headers X-Account-Id
		store memory {
			name fingerprint-config
		}
	}
}
http://localhost:9590 {
	route /orders* {
		idempotency
		reverse_proxy %[1]s
	}
	route /raw* {
		idempotency {
			fingerprint body
		}
		reverse_proxy %[1]s
	}
}`, upstream.Listener.Addr()), "caddyfile")

	send := func(path, key, account, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9590"+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Account-Id", account)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") + " " + string(got)
	}

	// A memory table of its own, and keys no other test uses: the memory
	// store outlives the configs of one process.
	if code, got := send("/orders", "fp-json-1", "acme", `{"sku":"tea","sent_at":"10:00"}`); code != 201 || got != " order 1" {
		t.Fatalf("first order: %d %q", code, got)
	}
	if code, got := send("/orders", "fp-json-1", "acme", `{ "sent_at": "10:05", "sku": "tea" }`); code != 201 || got != "true order 1" {
		t.Fatalf("retry with a fresh sent_at: %d %q, want the replay", code, got)
	}
	if code, _ := send("/orders", "fp-json-1", "globex", `{"sku":"tea","sent_at":"10:00"}`); code != 422 {
		t.Fatalf("another account: %d, want 422", code)
	}
	if code, _ := send("/orders", "fp-json-1", "acme", `{"sku":"coffee","sent_at":"10:00"}`); code != 422 {
		t.Fatalf("another sku: %d, want 422", code)
	}

	// Its own mode, the global headers, no pointers.
	if code, got := send("/raw", "fp-body-1", "acme", `{"sku":"tea","sent_at":"10:00"}`); code != 201 || got != " order 2" {
		t.Fatalf("first raw: %d %q", code, got)
	}
	if code, _ := send("/raw", "fp-body-1", "acme", `{"sku":"tea","sent_at":"10:05"}`); code != 422 {
		t.Fatalf("raw with a fresh sent_at: %d, want 422", code)
	}
	if code, _ := send("/raw", "fp-body-1", "globex", `{"sku":"tea","sent_at":"10:00"}`); code != 422 {
		t.Fatalf("raw for another account: %d, want 422", code)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
}
