package idempotency

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// fingerprint_only: only the selected members make the payload; the rest
// of the body may change between retries.
func TestFingerprintOnly(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.Fingerprint = fingerprint.JSON
		h.FingerprintOnly = []string{"/amount", "/items/*/sku"}
	})
	b := &backend{}
	wantStatus(t, do(h, b, post("/pay", "k", `{"amount":100,"items":[{"sku":"a","note":"x"}],"sent_at":1}`)), http.StatusCreated)
	for _, same := range []string{
		`{"sent_at":2,"amount":100.0,"items":[{"note":"y","sku":"a"}],"trace":"t"}`,
		`{"amount":1e2,"items":[{"sku":"a"}]}`,
	} {
		if r := do(h, b, post("/pay", "k", same)); r.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: %d, want a replay", same, r.Code)
		}
	}
	for _, other := range []string{
		`{"amount":101,"items":[{"sku":"a"}]}`,
		`{"amount":100,"items":[{"sku":"b"}]}`,
		`{"amount":100,"items":[{"sku":"a"},{"sku":"a"}]}`,
		`{"amount":100}`,
		`{"amount":100,"items":[{"sku":null}]}`,
		`not json`,
	} {
		wantProblem(t, do(h, b, post("/pay", "k", other)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}
}

func TestFingerprintOnlyConfig(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n fingerprint json\n fingerprint_only /amount /currency\n}")); err != nil ||
		strings.Join(h.FingerprintOnly, " ") != "/amount /currency" {
		t.Fatalf("parsed %q, %v", h.FingerprintOnly, err)
	}
	for _, tc := range []struct{ opts, want string }{
		{"fingerprint_only /amount", "fingerprint_only applies only with fingerprint json, not body"},
		{"fingerprint json\n\t\tfingerprint_only /a\n\t\tfingerprint_ignore /b", "fingerprint_only and fingerprint_ignore"},
		{"fingerprint json\n\t\tfingerprint_only amount", "not a JSON pointer"},
	} {
		site := "{\n\tadmin off\n}\n:9712 {\n\tidempotency {\n\t\t" + tc.opts + "\n\t}\n\trespond ok\n}\n"
		if err := validateCaddyfile(t, site); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.opts, err, tc.want)
		}
	}
}
