package idempotency

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// expiry_header: the first answer says when its record expires, every
// replay the stored record's own expiry; replay_header always marks first
// answers false. Neither is stored.
func TestExpiryAndReplayHeaders(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) {
			h.ExpiryHeader = "Idempotency-Expires"
			h.ReplayHeaderAlways = true
			h.TTL = caddy.Duration(time.Hour)
		})
		b := &backend{}
		before := time.Now()
		first := do(h, b, post("/p", "k", "x"))
		wantStatus(t, first, http.StatusCreated)
		if got := first.Header().Get("Idempotent-Replayed"); got != "false" {
			t.Errorf("first answer: Idempotent-Replayed %q, want false", got)
		}
		exp, err := http.ParseTime(first.Header().Get("Idempotency-Expires"))
		if err != nil || exp.Before(before.Add(time.Hour).Truncate(time.Second)) || exp.After(time.Now().Add(time.Hour)) {
			t.Errorf("first answer: Idempotency-Expires %q (%v), want now plus ttl", first.Header().Get("Idempotency-Expires"), err)
		}
		time.Sleep(1100 * time.Millisecond) // a second later, now plus ttl would differ
		replay := do(h, b, post("/p", "k", "x"))
		if got := replay.Header().Values("Idempotent-Replayed"); len(got) != 1 || got[0] != "true" {
			t.Errorf("replay: Idempotent-Replayed %q, want true", got)
		}
		rexp, err := http.ParseTime(replay.Header().Get("Idempotency-Expires"))
		if err != nil || rexp.Sub(exp).Abs() > time.Second {
			t.Errorf("replay: Idempotency-Expires %q (%v), want the record's own, %v", replay.Header().Get("Idempotency-Expires"), err, exp)
		}
		// A released answer has no record: no expiry.
		b.serve = func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}
		failed := do(h, b, post("/p", "k2", "x"))
		if got := failed.Header().Get("Idempotency-Expires"); got != "" {
			t.Errorf("a released 503 carries Idempotency-Expires %q", got)
		}
	})
}

func TestExpiryAndReplayHeadersConfig(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n replay_header X-Replayed always\n expiry_header Idempotency-Expires\n}")); err != nil {
		t.Fatal(err)
	}
	if h.ReplayHeader != "X-Replayed" || !h.ReplayHeaderAlways || h.ExpiryHeader != "Idempotency-Expires" {
		t.Fatalf("parsed %q %v %q", h.ReplayHeader, h.ReplayHeaderAlways, h.ExpiryHeader)
	}
	for _, in := range []string{"replay_header X sometimes", "replay_header", "expiry_header"} {
		if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n " + in + "\n}")); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
}

// A first answer that the next handler leaves empty (Caddy's implicit empty
// 200) is an answer like any: it carries replay_header ... always and
// expiry_header, as its replay does.
func TestEmptyFirstAnswerIsMarked(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.ReplayHeader, h.ReplayHeaderAlways, h.ExpiryHeader = "Idempotent-Replayed", true, "Idempotency-Expires"
	})
	empty := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	for _, want := range []string{"false", "true"} {
		r := do(h, empty, post("/orders", "empty-200", "x"))
		wantStatus(t, r, http.StatusOK)
		if got := r.Header().Get("Idempotent-Replayed"); got != want {
			t.Errorf("Idempotent-Replayed = %q, want %q", got, want)
		}
		if r.Header().Get("Idempotency-Expires") == "" {
			t.Errorf("the answer (replayed %s) has no Idempotency-Expires", want)
		}
	}
}
