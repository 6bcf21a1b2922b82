package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// problem_base points the problems' type at an API team's own error docs;
// every problem says its language.
func TestProblemBase(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.ProblemBase = "https://api.example.com/docs/idempotency"
		h.Required = true
	})
	r := do(h, &backend{}, post("/p", "", "x"))
	var p struct{ Type string }
	if err := json.Unmarshal(r.Body.Bytes(), &p); err != nil || p.Type != "https://api.example.com/docs/idempotency#missing-key" {
		t.Errorf("problem type %q (%v), want the base's #missing-key", p.Type, err)
	}
	if got := r.Header().Get("Content-Language"); got != "en" {
		t.Errorf("Content-Language %q, want en", got)
	}
	wantStatus(t, r, http.StatusBadRequest)

	var parsed Handler
	if err := parsed.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n problem_base https://api.example.com/errors\n}")); err != nil || parsed.ProblemBase != "https://api.example.com/errors" {
		t.Fatalf("parsed problem_base %q, %v", parsed.ProblemBase, err)
	}
	for _, bad := range []string{"/relative", "https://x.example/a#frag", "not a uri"} {
		o := Handler{Options: app.Options{ProblemBase: bad}}
		o.SetDefaults()
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "problem_base") {
			t.Errorf("Validate of problem_base %q = %v", bad, err)
		}
	}
}
