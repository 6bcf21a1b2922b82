package idempotency

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// gzipBackend answers with a gzip body, whatever the request accepts, as
// an upstream that compressed for the first client leaves it stored.
func gzipBackend(t *testing.T, plain string) *backend {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(plain))
	zw.Close()
	return &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Vary", "Accept-Encoding")
		w.Write(buf.Bytes())
		return nil
	}}
}

// slowWriter is a client that reads slowly.
type slowWriter struct {
	*httptest.ResponseRecorder
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(20 * time.Millisecond)
	return w.ResponseRecorder.Write(p)
}

// Many retries without Accept-Encoding of a stored gzip body, each read
// slowly: each gets the body decoded, in turn for the decode slots.
func TestManyDecodedReplays(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	plain := strings.Repeat("tea, ", 2000)
	b := gzipBackend(t, plain)
	first := post("/orders", "decode-many", "{}")
	first.Header.Set("Accept-Encoding", "gzip")
	wantStatus(t, do(h, b, first), http.StatusOK)

	defer func(d time.Duration) { decodeWait = d }(decodeWait)
	decodeWait = time.Minute
	const retries = 50
	var wg sync.WaitGroup
	answers := make([]*slowWriter, retries)
	for i := range retries {
		wg.Go(func() {
			req, _ := withReplacer(post("/orders", "decode-many", "{}"))
			w := &slowWriter{ResponseRecorder: httptest.NewRecorder()}
			if err := h.ServeHTTP(w, req, b); err != nil {
				t.Errorf("ServeHTTP: %v", err)
			}
			answers[i] = w
		})
	}
	wg.Wait()
	for i, w := range answers {
		if w.Code != http.StatusOK || w.Body.String() != plain || w.Header().Get("Content-Encoding") != "" ||
			w.Header().Get("Content-Length") != strconv.Itoa(len(plain)) {
			t.Fatalf("retry %d: %d, Content-Encoding %q, Content-Length %q, %d bytes; want the decoded body",
				i, w.Code, w.Header().Get("Content-Encoding"), w.Header().Get("Content-Length"), w.Body.Len())
		}
	}
	if n := len(decodeSlots); n != 0 {
		t.Errorf("%d decode slots are still taken", n)
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("the backend ran %d times, want 1", n)
	}
}

// With every decode slot taken, a retry that needs one waits decodeWait,
// then gets 503 with Retry-After; one that left while waiting is counted
// as gone; one that accepts the stored coding needs no slot.
func TestReplayDecodeBusy(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	plain := strings.Repeat("tea, ", 200)
	b := gzipBackend(t, plain)
	accepting := func() *http.Request {
		r := post("/orders", "decode-busy", "{}")
		r.Header.Set("Accept-Encoding", "gzip")
		return r
	}
	wantStatus(t, do(h, b, accepting()), http.StatusOK)

	defer func(d time.Duration) { decodeWait = d }(decodeWait)
	decodeWait = 20 * time.Millisecond
	for range maxDecodes {
		decodeSlots <- struct{}{}
	}
	taken := maxDecodes
	defer func() {
		for range taken {
			<-decodeSlots
		}
	}()

	r := do(h, b, post("/orders", "decode-busy", "{}"))
	wantProblem(t, r, http.StatusServiceUnavailable, "The response for this Idempotency-Key cannot be replayed right now")
	if ra := r.Header().Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	if got := r.placeholder("http.idempotency.result"); got != "replay_busy" {
		t.Errorf("result %q, want replay_busy", got)
	}

	r = do(h, b, accepting())
	wantStatus(t, r, http.StatusOK)
	if r.Header().Get("Content-Encoding") != "gzip" {
		t.Errorf("a retry that accepts gzip got Content-Encoding %q", r.Header().Get("Content-Encoding"))
	}

	decodeWait = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	r = do(h, b, post("/orders", "decode-busy", "{}").WithContext(ctx))
	if r.Code != statusClientClosed || r.placeholder("http.idempotency.result") != "client_gone" || r.err != nil {
		t.Errorf("a client that left while waiting: %d, result %q, error %v; want 499, client_gone, nil",
			r.Code, r.placeholder("http.idempotency.result"), r.err)
	}

	<-decodeSlots // one slot free
	taken--
	r = do(h, b, post("/orders", "decode-busy", "{}"))
	wantStatus(t, r, http.StatusOK)
	if r.Body.String() != plain {
		t.Errorf("with a slot free: %d bytes, want the decoded %d", r.Body.Len(), len(plain))
	}
	if n := len(decodeSlots); n != taken {
		t.Errorf("%d slots taken after the replays, want %d: a replay kept its slot", n, taken)
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("the backend ran %d times, want 1", n)
	}
}
