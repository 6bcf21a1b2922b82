package idempotency

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestUpstreamReceivesBodyExactly(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{}
	body := make([]byte, 0, 256*40)
	for range 40 {
		for c := range 256 {
			body = append(body, byte(c))
		}
	}
	req := httptest.NewRequest(http.MethodPost, "http://h/p", bytes.NewReader(body))
	req.ContentLength = -1 // as if chunked
	req.Header.Set("Idempotency-Key", "bin")
	wantStatus(t, do(h, b, req), 201)
	if !bytes.Equal(b.bodies[0], body) {
		t.Fatalf("upstream got %d bytes, not the %d sent", len(b.bodies[0]), len(body))
	}
}

func TestRequestBodyLimit(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.MaxRequestBody = 10 })
	b := &backend{}
	wantStatus(t, do(h, b, post("/p", "k", "0123456789")), 201)
	wantProblem(t, do(h, b, post("/p", "k2", "0123456789A")), 413, "Request body too large")
	chunked := post("/p", "k3", "0123456789A")
	chunked.ContentLength = -1
	r := do(h, b, chunked)
	wantProblem(t, r, 413, "Request body too large")
	if r.placeholder("http.idempotency.result") != "too_large" || b.runs.Load() != 1 {
		t.Fatalf("result %q, %d runs", r.placeholder("http.idempotency.result"), b.runs.Load())
	}
}
