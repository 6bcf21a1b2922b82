package idempotency

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// flushRecorder records when flushes reach the client.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushedAt []int // body length at each flush
}

func (f *flushRecorder) Flush() {
	f.flushedAt = append(f.flushedAt, f.Body.Len())
	f.ResponseRecorder.Flush()
}

func TestLargeResponseStreamsAndIsNotReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.MaxResponseBody = 1 << 20 })
		chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(200)
			for range 32 { // 2 MiB
				w.Write(chunk)
				http.NewResponseController(w).Flush()
			}
			return nil
		}}
		req := post("/export", "big", "x")
		w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
		req, _ = withReplacer(req)
		if err := h.ServeHTTP(w, req, b); err != nil {
			t.Fatal(err)
		}
		if w.Body.Len() != 32*len(chunk) {
			t.Fatalf("client got %d bytes, want all %d", w.Body.Len(), 32*len(chunk))
		}
		if len(w.flushedAt) != 32 || w.flushedAt[0] != len(chunk) {
			t.Fatalf("flushes did not pass through as written: %v", w.flushedAt[:min(3, len(w.flushedAt))])
		}
		r := do(h, b, post("/export", "big", "x"))
		wantProblem(t, r, 409, "The response for this Idempotency-Key cannot be replayed")
		if r.Header().Get("Retry-After") != "" || b.runs.Load() != 1 {
			t.Fatalf("too-large retry: Retry-After %q, %d runs", r.Header().Get("Retry-After"), b.runs.Load())
		}
	})
}

func TestResponseAtLimitIsReplayed(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.MaxResponseBody = 64 })
	body := bytes.Repeat([]byte("z"), 64)
	b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error { w.Write(body); return nil }}
	wantStatus(t, do(h, b, post("/p", "k", "x")), 200)
	r := do(h, b, post("/p", "k", "x"))
	if !bytes.Equal(r.Body.Bytes(), body) || b.runs.Load() != 1 {
		t.Fatalf("a response of exactly max_response_body was not replayed: %q", r.Body)
	}
}
