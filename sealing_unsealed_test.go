package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const unreadableTitle = "The stored response for this Idempotency-Key cannot be read"

// rawStoreOf is the store under h's wrappers: what anyone who can write
// to the store writes to.
func rawStoreOf(h *Handler) store.Store { return h.store.(*observed).Store.(*sealing.Store).Store }

// bindingOf is the endpoint and fingerprint that h gives req.
func bindingOf(h *Handler, req *http.Request, body string) (string, store.Fingerprint) {
	_, repl := withReplacer(req)
	return fingerprint.Endpoint(h.Endpoint, req, repl), h.payload.Of(req, []byte(body))
}

// plant writes a completed record with resp, bound to endpoint and fp,
// straight into s, as a writer behind the handler's back would.
func plant(t *testing.T, s store.Store, k store.Key, endpoint string, fp store.Fingerprint, resp store.Response) {
	t.Helper()
	c := &store.Claim{Token: store.NewToken(), Endpoint: endpoint, Fingerprint: fp, CreatedAt: time.Now(), Lease: time.Minute}
	got, err := s.Acquire(context.Background(), k, c)
	if err != nil || got.Record != nil {
		t.Fatalf("claiming the key to plant: %v, %+v", err, got.Record)
	}
	if err := s.Complete(context.Background(), k, c, &resp, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// storedRecord reads k's live record from s as it is stored.
func storedRecord(t *testing.T, s store.Store, k store.Key) *store.Record {
	t.Helper()
	got, err := s.Acquire(context.Background(), k, &store.Claim{Token: store.NewToken(), Lease: time.Minute})
	if err != nil || got.Record == nil {
		t.Fatalf("reading the stored record: %v, %+v", err, got.Record)
	}
	return got.Record
}

func unreadableCount(reason string) float64 {
	return testutil.ToFloat64(collectors.unreadable.WithLabelValues(reason))
}

// With encryption_keys, a completed response that is not sealed was not
// written by this handler: it is refused like one that fails
// authentication, and never run again. The markers that hold no response
// (truncated, outcome unknown) are not sealed, so they are answered as
// ever, and a request with another endpoint still gets 422.
func TestUnsealedRecordRefused(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), withKeys(sealKeyA))
	logs := watchLogs(h)
	raw := rawStoreOf(h)
	b := secretBackend("never-run")
	planted := store.Response{Status: 201, Header: http.Header{"X-Secret": {"planted"}}, Body: []byte(`{"card":"planted"}`)}
	for _, tc := range []struct {
		key    string
		resp   store.Response
		status int
	}{
		{"k-unsealed", planted, 500},
		{"k-truncated", store.Response{Status: 201, Truncated: true}, 409},
		{"k-unknown", store.Response{OutcomeUnknown: true}, 502},
	} {
		req := post("/u", tc.key, `{}`)
		endpoint, fp := bindingOf(h, req, `{}`)
		plant(t, raw, store.NewKey("", tc.key), endpoint, fp, tc.resp)
		before := unreadableCount("unsealed")
		r := do(h, b, req)
		if tc.status == 500 {
			wantProblem(t, r, 500, unreadableTitle)
		} else {
			wantStatus(t, r, tc.status)
		}
		if strings.Contains(r.Body.String(), "planted") || r.Header().Get("X-Secret") != "" {
			t.Fatalf("%s: the planted response was replayed: %v %s", tc.key, r.Header(), r.Body)
		}
		want := 0.0
		if tc.status == 500 {
			want = 1
		}
		if got := unreadableCount("unsealed") - before; got != want {
			t.Fatalf("%s: unreadable_records_total{reason=unsealed} grew by %v, want %v", tc.key, got, want)
		}
	}
	if b.runs.Load() != 0 {
		t.Fatalf("%d runs, want 0: a planted record's key ran again", b.runs.Load())
	}
	wantUnreadableLog(t, logs, "unsealed", "")
	wantProblem(t, do(h, b, post("/other", "k-unsealed", `{}`)), 422, "Idempotency-Key is already used")
}

// What stays in the clear of a sealed record (its endpoint, fingerprint,
// status and flags) is authenticated: a sealed record moved to another
// binding, or made to say something else, fails authentication. Each
// change is planted in a store of its own, under the same key.
func TestSealedRecordRebound(t *testing.T) {
	sealer := provision(t, storeConfigs[0].raw(t), withKeys(sealKeyA))
	b := secretBackend("rebound-secret")
	wantStatus(t, do(sealer, b, post("/a", "k-bind", `{}`)), 201)
	k := store.NewKey("", "k-bind")
	sealed := storedRecord(t, rawStoreOf(sealer), k)
	if !sealed.Sealed {
		t.Fatal("the handler stored an unsealed response")
	}
	for _, tc := range []struct {
		name       string
		path, body string // the request that the changed record is bound to
		change     func(*store.Response)
	}{
		{"endpoint", "/b", `{}`, nil},
		{"fingerprint", "/a", `{"amount":1}`, nil},
		{"status", "/a", `{}`, func(r *store.Response) { r.Status = 200 }},
		{"truncated", "/a", `{}`, func(r *store.Response) { r.Truncated = true }},
		{"outcome_unknown", "/a", `{}`, func(r *store.Response) { r.OutcomeUnknown = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provision(t, storeConfigs[0].raw(t), withKeys(sealKeyA))
			req := post(tc.path, "k-bind", tc.body)
			endpoint, fp := bindingOf(h, req, tc.body)
			resp := sealed.Response
			if tc.change != nil {
				tc.change(&resp)
			}
			plant(t, rawStoreOf(h), k, endpoint, fp, resp)
			before := unreadableCount("authentication")
			r := do(h, b, req)
			wantProblem(t, r, 500, unreadableTitle)
			if got := unreadableCount("authentication") - before; got != 1 {
				t.Fatalf("unreadable_records_total{reason=authentication} grew by %v, want 1", got)
			}
			if b.runs.Load() != 1 {
				t.Fatalf("%d runs, want 1", b.runs.Load())
			}
		})
	}
	// the control: the record as it was sealed, planted the same way, opens
	h := provision(t, storeConfigs[0].raw(t), withKeys(sealKeyA))
	plant(t, rawStoreOf(h), k, sealed.Endpoint, sealed.Fingerprint, sealed.Response)
	wantSecretReplay(t, do(h, b, post("/a", "k-bind", `{}`)), "rebound-secret")
}

// The migration to encryption_keys: a record stored without keys is
// replayed as it is by a handler with accept_unsealed, which seals what it
// stores, and refused once accept_unsealed is gone.
func TestAcceptUnsealedMigration(t *testing.T) {
	raw := storeConfigs[0].raw(t)
	b := secretBackend("migrated-secret")
	before := provision(t, raw, nil)
	wantStatus(t, do(before, b, post("/m", "k-old", `{}`)), 201)

	migrating := provision(t, raw, func(h *Handler) { h.EncryptionKeys, h.AcceptUnsealed = []string{sealKeyA}, true })
	wantSecretReplay(t, do(migrating, b, post("/m", "k-old", `{}`)), "migrated-secret")
	wantStatus(t, do(migrating, b, post("/m", "k-new", `{}`)), 201)
	if !storedRecord(t, rawStoreOf(migrating), store.NewKey("", "k-new")).Sealed {
		t.Fatal("a handler with accept_unsealed stored an unsealed response")
	}
	// a planted one is replayed as well: that is what the option accepts
	planted := store.Response{Status: 201, Header: http.Header{"X-Secret": {"planted"}}, Body: []byte("planted")}
	req := post("/m", "k-planted", `{}`)
	endpoint, fp := bindingOf(migrating, req, `{}`)
	plant(t, rawStoreOf(migrating), store.NewKey("", "k-planted"), endpoint, fp, planted)
	if r := do(migrating, b, req); r.Code != 201 || r.Header().Get("X-Secret") != "planted" || r.Body.String() != "planted" {
		t.Fatalf("accept_unsealed: %d %v %s, want the planted response", r.Code, r.Header(), r.Body)
	}

	after := provision(t, raw, withKeys(sealKeyA))
	wantProblem(t, do(after, b, post("/m", "k-old", `{}`)), 500, unreadableTitle)
	wantSecretReplay(t, do(after, b, post("/m", "k-new", `{}`)), "migrated-secret")
	if b.runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", b.runs.Load())
	}
}

// accept_unsealed in both Caddyfile places and in JSON; it needs
// encryption_keys, the route's own or the global option's, which a route
// inherits it from like the other flags.
func TestAcceptUnsealedConfig(t *testing.T) {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`{
	idempotency {
		encryption_keys {env.IDEMPOTENCY_KEY}
		accept_unsealed
	}
}

:8080 {
	idempotency /own/* {
		encryption_keys {env.ROUTE_KEY}
		accept_unsealed
	}
	respond "ok"
}`), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, want := range []string{
		`"idempotency":{"encryption_keys":["{env.IDEMPOTENCY_KEY}"],"accept_unsealed":true}`,
		`{"accept_unsealed":true,"encryption_keys":["{env.ROUTE_KEY}"],"handler":"idempotency"}`,
	} {
		if !strings.Contains(string(cfgJSON), want) {
			t.Errorf("adapted config lacks %s:\n%s", want, cfgJSON)
		}
	}
	for in, want := range map[string]string{
		"idempotency {\n accept_unsealed yes\n}":               "accept_unsealed: unexpected argument 'yes'",
		"idempotency {\n accept_unsealed\n accept_unsealed\n}": "accept_unsealed already specified",
	} {
		if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", in, err, want)
		}
	}

	// without keys: refused at Validate, the handler's and the app's
	h := Handler{Options: app.Options{AcceptUnsealed: true, StoreRaw: storeConfigs[0].raw(t)}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err == nil || !strings.Contains(err.Error(), "accept_unsealed applies only with encryption_keys") {
		t.Errorf("accept_unsealed without keys: Validate = %v", err)
	}
	cancel()
	if _, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"accept_unsealed":true}`),
	}}); err == nil || !strings.Contains(err.Error(), "accept_unsealed applies only with encryption_keys") {
		t.Errorf("the global option's accept_unsealed without keys: %v", err)
	}

	appKeys, _ := json.Marshal([]string{sealKeyA})
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"accept_unsealed":true,"encryption_keys":` + string(appKeys) + `}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, own := range []app.Options{{}, {EncryptionKeys: []string{sealKeyB}}} {
		ctx, cancel := caddy.NewContext(base)
		own.StoreRaw = storeConfigs[0].raw(t)
		h := Handler{Options: own}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.Validate(); err != nil {
			t.Fatal(err)
		}
		if !h.AcceptUnsealed || !h.store.(*observed).Store.(*sealing.Store).AcceptUnsealed {
			t.Errorf("route with %d keys of its own did not inherit accept_unsealed", len(own.EncryptionKeys))
		}
		cancel()
	}
}
