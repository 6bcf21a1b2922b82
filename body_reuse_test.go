package idempotency

import (
	"io"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// A body the handler buffered is the next handler's for as long as it
// holds it: a RoundTripper may read it after RoundTrip returned. Whatever
// path the request took (here: key_from json, no key in the body, a route
// that does not require one), a later request never writes into it.
func TestBufferedBodyOutlivesTheHandler(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.KeyFrom = &app.KeyFrom{JSON: "/id"} })
	var kept io.Reader
	late := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if kept == nil {
			kept = r.Body // read after the handler returned, as a transport may
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	})
	first := `{"note":"first request, no key"}`
	wantStatus(t, do(h, late, post("/orders", "", first)), http.StatusCreated)
	for range 20 {
		do(h, late, post("/orders", "", `{"note":"ANOTHER CLIENT'S BYTES!!"}`))
		do(h, late, post("/orders", "", `{"id":"k-`+itoa(testSeq.Add(1))+`","note":"ANOTHER CLIENT'S BYTES"}`))
	}
	got, err := io.ReadAll(kept)
	if err != nil || string(got) != first {
		t.Fatalf("the first request's body read late = %q, %v; want %q", got, err, first)
	}
}
