package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// RFC 9110 requires a challenge in every 401: require_scope's names the
// operator's scheme, or Bearer by default.
func TestRequireScopeSendsAChallenge(t *testing.T) {
	for _, tc := range []struct{ challenge, want string }{
		{"", "Bearer"},
		{`Basic realm="payments"`, `Basic realm="payments"`},
	} {
		h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
			h.Scope = "{http.request.header.X-Tenant}"
			h.RequireScope = true
			h.ScopeChallenge = tc.challenge
		})
		r := do(h, &backend{}, post("/p", "k", "x"))
		wantStatus(t, r, http.StatusUnauthorized)
		if got := r.Header().Values("WWW-Authenticate"); len(got) != 1 || got[0] != tc.want {
			t.Errorf("challenge %q: WWW-Authenticate %q, want %q", tc.challenge, got, tc.want)
		}
	}
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n require_scope Basic realm=\"payments\"\n}")); err != nil {
		t.Fatal(err)
	}
	if !h.RequireScope || h.ScopeChallenge != `Basic realm="payments"` {
		t.Fatalf("parsed require_scope %v, challenge %q", h.RequireScope, h.ScopeChallenge)
	}
	bad := Handler{Options: app.Options{ScopeChallenge: "Basic\r\nX: y"}}
	bad.SetDefaults()
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "require_scope") {
		t.Errorf("Validate of a challenge with a line break = %v", err)
	}
}
