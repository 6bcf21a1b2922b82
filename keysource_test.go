package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// key_from json: the key is a string member of the JSON body, as Square's
// API sends idempotency_key; the body still reaches the upstream whole.
func TestKeyFromJSONBody(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.KeyFrom = &app.KeyFrom{JSON: "/idempotency_key"}
		h.Fingerprint = fingerprint.JSON
	})
	b := &backend{}
	body := `{"amount":100,"idempotency_key":"sq-1"}`
	first := do(h, b, post("/pay", "", body))
	wantStatus(t, first, http.StatusCreated)
	if string(b.bodies[0]) != body {
		t.Errorf("the upstream got %q, want the body whole", b.bodies[0])
	}
	retry := do(h, b, post("/pay", "", `{ "idempotency_key": "sq-1", "amount": 100 }`))
	if retry.Header().Get("Idempotent-Replayed") != "true" || b.runs.Load() != 1 {
		t.Errorf("retry: replayed %q, runs %d; want a replay", retry.Header().Get("Idempotent-Replayed"), b.runs.Load())
	}
	wantProblem(t, do(h, b, post("/pay", "", `{"amount":200,"idempotency_key":"sq-1"}`)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
	// Not JSON, no member, or not a string: a request without a key.
	for _, keyless := range []string{`amount=100`, `{"amount":100}`, `{"idempotency_key":7}`, ``} {
		wantStatus(t, do(h, b, post("/pay", "", keyless)), http.StatusCreated)
	}
	wantProblem(t, do(h, b, post("/pay", "", `{"idempotency_key":"bad key"}`)), http.StatusBadRequest, "Idempotency-Key is invalid")
	if n := b.runs.Load(); n != 5 {
		t.Errorf("ran %d times, want 5", n)
	}

	req := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.KeyFrom = &app.KeyFrom{JSON: "/event/id"}
		h.Required = true
	})
	r := do(req, b, post("/hook", "", `{"event":{"type":"paid"}}`))
	wantProblem(t, r, http.StatusBadRequest, "Idempotency-Key is missing")
	if !strings.Contains(r.Body.String(), "/event/id") {
		t.Errorf("the 400 does not name the pointer: %s", r.Body)
	}
	wantStatus(t, do(req, b, post("/hook", "", `{"event":{"id":"evt_1"}}`)), http.StatusCreated)
	replay := do(req, b, post("/hook", "", `{"event":{"id":"evt_1"}}`))
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("the webhook's second delivery was not a replay: %d", replay.Code)
	}
}

// key_from query: the key stays in the query the upstream sees.
func TestKeyFromQuery(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.KeyFrom = &app.KeyFrom{Query: "idempotency_key"} })
	var seen string
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		seen = r.URL.RawQuery
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	wantStatus(t, do(h, b, post("/pay?idempotency_key=q-1&x=1", "", "a")), http.StatusCreated)
	if seen != "idempotency_key=q-1&x=1" {
		t.Errorf("the upstream's query %q, want the key in it", seen)
	}
	if r := do(h, b, post("/pay?idempotency_key=q-1&x=1", "", "a")); r.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry not replayed: %d", r.Code)
	}
	// The header is not the key any more.
	wantStatus(t, do(h, b, post("/pay", "q-1", "a")), http.StatusCreated)
	wantProblem(t, do(h, b, post("/pay?idempotency_key=a&idempotency_key=b", "", "a")), http.StatusBadRequest, "Idempotency-Key is invalid")
	if n := b.runs.Load(); n != 2 {
		t.Errorf("ran %d times, want 2", n)
	}
}

func TestKeyFromConfig(t *testing.T) {
	for in, want := range map[string]app.Options{
		"key_from header X-Key":          {KeyHeader: "X-Key"},
		"key_from query idem":            {KeyFrom: &app.KeyFrom{Query: "idem"}},
		"key_from json /idempotency_key": {KeyFrom: &app.KeyFrom{JSON: "/idempotency_key"}},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n " + in + "\n}")); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if h.KeyHeader != want.KeyHeader || (h.KeyFrom == nil) != (want.KeyFrom == nil) || h.KeyFrom != nil && *h.KeyFrom != *want.KeyFrom {
			t.Errorf("%s: parsed %q %+v", in, h.KeyHeader, h.KeyFrom)
		}
	}
	for in, want := range map[string]string{
		"key_from body x": "unknown source 'body'",
		"key_from json":   "want header <name>, query <name> or json <pointer>",
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n " + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
	for _, tc := range []struct {
		opts app.Options
		want string
	}{
		{app.Options{KeyFrom: &app.KeyFrom{}}, "key_from: name one of query and json"},
		{app.Options{KeyFrom: &app.KeyFrom{Query: "a", JSON: "/b"}}, "key_from: name one of query and json"},
		{app.Options{KeyFrom: &app.KeyFrom{Query: "a"}, KeyHeader: "X-Key"}, "choose one"},
	} {
		h := Handler{Options: tc.opts}
		h.SetDefaults()
		if err := h.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want %q", tc.opts, err, tc.want)
		}
	}
	if _, err := newKeySource("", &app.KeyFrom{JSON: "idempotency_key"}); err == nil || !strings.Contains(err.Error(), "not a JSON pointer") {
		t.Errorf("a pointer without / = %v", err)
	}
}
