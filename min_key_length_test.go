package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// min_key_length refuses keys too short to be unique (the IETF draft asks
// for keys with enough entropy), with the invalid-key 400.
func TestMinKeyLength(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.MinKeyLength = 8 })
	b := &backend{}
	r := do(h, b, post("/p", "short", "x"))
	wantProblem(t, r, http.StatusBadRequest, "Idempotency-Key is invalid")
	if !strings.Contains(r.Body.String(), "8 to 255") {
		t.Errorf("the detail does not name the bounds: %s", r.Body)
	}
	wantStatus(t, do(h, b, post("/p", "long-enough", "x")), http.StatusCreated)
	if n := b.runs.Load(); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}

	var parsed Handler
	if err := parsed.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n min_key_length 36\n}")); err != nil || parsed.MinKeyLength != 36 {
		t.Fatalf("parsed min_key_length %d, %v", parsed.MinKeyLength, err)
	}
	for _, n := range []int{-1, 256} {
		o := Handler{Options: app.Options{MinKeyLength: n}}
		o.SetDefaults()
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "min_key_length") {
			t.Errorf("Validate of min_key_length %d = %v", n, err)
		}
	}
}
