package idempotency

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// TestInCaddy runs the directive inside a real Caddy, in process, with the
// neighbours it is ordered against: basic_auth (the default scope is the
// authenticated user), encode (the stored response is the uncompressed one)
// and reverse_proxy to a real upstream.
func TestInCaddy(t *testing.T) {
	var runs atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s: %s %s", n, r.Header.Get("X-User"), body, strings.Repeat(".", 2000))
	}))
	defer upstream.Close()

	hash := func(pw string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9580
	https_port 9543
	grace_period 1ns
}
http://localhost:9580 {
	reverse_proxy %s {
		header_up X-User {http.auth.user.id}
	}
	idempotency {
		store memory
	}
	encode gzip
	basic_auth {
		alice %s
		bob %s
	}
	log_append idempotency {http.idempotency.result}
}`, upstream.Listener.Addr(), hash("alice-pw"), hash("bob-pw")), "caddyfile")

	send := func(user, key string, gz bool) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9580/orders", strings.NewReader(`{"sku":"tea"}`))
		req.SetBasicAuth(user, user+"-pw")
		req.Header.Set("Idempotency-Key", key)
		if gz {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		resp := tester.AssertResponseCode(req, http.StatusCreated)
		var r io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		body, _ := io.ReadAll(r)
		resp.Body.Close()
		return resp, string(body)
	}

	// Compressed on the way out, stored uncompressed: the replay to a
	// client without gzip is plain text, the one with gzip is compressed.
	first, body := send("alice", "k1", true)
	if first.Header.Get("Content-Encoding") != "gzip" || !strings.HasPrefix(body, "order 1 for alice") {
		t.Fatalf("first answer %v %q", first.Header, body[:30])
	}
	plain, replayed := send("alice", "k1", false)
	if plain.Header.Get("Content-Encoding") != "" || plain.Header.Get("Idempotent-Replayed") != "true" || replayed != body {
		t.Fatalf("plain replay %v %q", plain.Header, replayed[:30])
	}
	gz, replayed := send("alice", "k1", true)
	if gz.Header.Get("Content-Encoding") != "gzip" || replayed != body {
		t.Fatalf("gzip replay %v", gz.Header)
	}
	// Same key, other user: the default scope is the authenticated user.
	_, bobs := send("bob", "k1", false)
	if !strings.HasPrefix(bobs, "order 2 for bob") {
		t.Fatalf("bob got %q: users share keys", bobs[:30])
	}
	if runs.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", runs.Load())
	}

	// The metrics reach Caddy's own /metrics endpoint.
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`caddy_idempotency_requests_total{result="new"}`,
		`caddy_idempotency_requests_total{result="replay"}`,
		`caddy_idempotency_store_operation_duration_seconds_count{operation="acquire",store="memory"}`,
	} {
		if !strings.Contains(string(metricsText), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Authentication runs first: a refused login stores nothing.
	req, _ := http.NewRequest(http.MethodPost, "http://localhost:9580/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k2")
	tester.AssertResponseCode(req, http.StatusUnauthorized)
	if runs.Load() != 2 {
		t.Fatal("an unauthenticated request reached the upstream")
	}
}

// A handle_errors block restyles the handler's refusals, with the problem's
// parts in placeholders; without one the answer is problem+json (above).
func TestHandleErrorsRestylesProblems(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(`{
	admin localhost:2999
	http_port 9581
	https_port 9544
	grace_period 1ns
}
http://localhost:9581 {
	idempotency {
		required
		store memory
	}
	respond "created" 201
	handle_errors {
		header Content-Type text/plain
		respond "{http.error.status_code} {http.idempotency.problem.title}: {http.idempotency.problem.detail}"
	}
}`, "caddyfile")

	req, _ := http.NewRequest(http.MethodPost, "http://localhost:9581/orders", strings.NewReader("x"))
	resp, body := tester.AssertResponse(req, http.StatusBadRequest,
		"400 Idempotency-Key is missing: This operation is idempotent and requires the Idempotency-Key request header.")
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain" {
		t.Fatalf("restyled answer has Content-Type %q: %s", ct, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("restyled answer has Cache-Control %q, want no-store", cc)
	}

	req, _ = http.NewRequest(http.MethodPost, "http://localhost:9581/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	tester.AssertResponse(req, http.StatusCreated, "created")
	req, _ = http.NewRequest(http.MethodPost, "http://localhost:9581/orders", strings.NewReader("other"))
	req.Header.Set("Idempotency-Key", "k")
	tester.AssertResponse(req, http.StatusUnprocessableEntity,
		"422 Idempotency-Key is already used: This key was used for a request with a different payload. Use a new key for a new operation.")
}
