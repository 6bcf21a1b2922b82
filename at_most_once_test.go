package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// With on_unknown_outcome keep, a claim taken over from an owner whose
// lease passed (its Caddy died while the upstream ran) is an unknown
// outcome: answered 502 and kept until ttl, never run a second time.
// Without keep, the takeover runs the request again, as before.
func TestTakeoverOfADeadOwnerIsAnUnknownOutcome(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		for _, keep := range []bool{true, false} {
			h := provision(t, raw, func(h *Handler) {
				if keep {
					h.OnUnknownOutcome = app.UnknownKeep
				}
			})
			b := &backend{}
			clientKey := "crashed-" + itoa(testSeq.Add(1))
			// The dead owner: a claim nobody renews or ends, of this very request.
			req := post("/pay", clientKey, "x")
			dead := &store.Claim{Token: store.NewToken(), Endpoint: "POST api.example.com/pay", Fingerprint: h.payload.Of(req, []byte("x")),
				CreatedAt: time.Now(), Lease: 100 * time.Millisecond, TTL: time.Minute}
			if got, err := h.store.Acquire(context.Background(), store.NewKey("", clientKey), dead); err != nil || got.Record != nil {
				t.Fatalf("the dead owner's claim: %v %v", got.Record, err)
			}
			time.Sleep(300 * time.Millisecond) // past its lease
			first := do(h, b, post("/pay", clientKey, "x"))
			retry := do(h, b, post("/pay", clientKey, "x"))
			if keep {
				wantProblem(t, first, http.StatusBadGateway, "The outcome of the request for this Idempotency-Key is unknown")
				wantProblem(t, retry, http.StatusBadGateway, "The outcome of the request for this Idempotency-Key is unknown")
				if n := b.runs.Load(); n != 0 {
					t.Errorf("keep: the upstream ran %d times after the takeover, want never", n)
				}
				continue
			}
			wantStatus(t, first, http.StatusCreated)
			if n := b.runs.Load(); n != 1 {
				t.Errorf("release: the upstream ran %d times, want 1", n)
			}
		}
	})
}

// With keep, a dead owner's claim stays bound to what it was claimed for:
// its request's retry is told the outcome is unknown (502), and the key
// used for another payload or endpoint is refused (422) as it would be had
// the dead request completed. Neither runs.
func TestDeadOwnersKeptClaimKeepsItsBinding(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.OnUnknownOutcome = app.UnknownKeep })
		b := &backend{}
		clientKey := "crashed-" + itoa(testSeq.Add(1))
		original := post("/pay", clientKey, `{"amount":100}`)
		dead := &store.Claim{Token: store.NewToken(), Endpoint: "POST api.example.com/pay", Fingerprint: h.payload.Of(original, []byte(`{"amount":100}`)),
			CreatedAt: time.Now(), Lease: 100 * time.Millisecond, TTL: time.Minute}
		if got, err := h.store.Acquire(context.Background(), store.NewKey("", clientKey), dead); err != nil || got.Record != nil {
			t.Fatalf("the dead owner's claim: %v %v", got.Record, err)
		}
		time.Sleep(300 * time.Millisecond) // past its lease

		wantProblem(t, do(h, b, post("/pay", clientKey, `{"amount":999}`)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
		wantProblem(t, do(h, b, post("/refund", clientKey, `{"amount":100}`)), http.StatusUnprocessableEntity, "Idempotency-Key is already used")
		wantProblem(t, do(h, b, original), http.StatusBadGateway, "The outcome of the request for this Idempotency-Key is unknown")
		if n := b.runs.Load(); n != 0 {
			t.Errorf("the upstream ran %d times, want never", n)
		}
	})
}
