package idempotency

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// encryption_keys inside a real Caddy, from the global option, on the file
// store, in front of reverse_proxy: the retry is replayed while the
// database file holds no trace of the response; after a reload that drops
// the key, the retry gets the 500 problem and the upstream is not called.
func TestSealingInCaddy(t *testing.T) {
	const marker = "card-4000056655665556"
	var runs atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Card", marker)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"card":%q}`, marker)
	}))
	defer upstream.Close()
	t.Setenv("IDEMPOTENCY_SEAL_OLD", sealKeyA)
	t.Setenv("IDEMPOTENCY_SEAL_NEW", sealKeyB)
	dir := t.TempDir()
	config := func(keys string) string {
		return fmt.Sprintf(`{
	admin localhost:2999
	http_port 9787
	https_port 9788
	grace_period 1ns
	idempotency {
		encryption_keys %s
		store file {
			path %s
		}
	}
}

http://localhost:9787 {
	idempotency
	reverse_proxy %s
}`, keys, dir, upstream.Listener.Addr())
	}
	send := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9787/cards", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "seal-in-caddy")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(config("{env.IDEMPOTENCY_SEAL_OLD}"), "caddyfile")
	for i, want := range []string{"", "true"} {
		resp := send()
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != want ||
			resp.Header.Get("X-Card") != marker || !strings.Contains(string(body), marker) {
			t.Fatalf("request %d: %d %v %s", i+1, resp.StatusCode, resp.Header, body)
		}
	}
	db, err := os.ReadFile(filepath.Join(dir, "idempotency.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(db, []byte(marker)) {
		t.Fatal("the file store's database holds the response in the clear")
	}

	tester.InitServer(config("{env.IDEMPOTENCY_SEAL_NEW}"), "caddyfile")
	resp := send()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(body), "#unreadable-record") || strings.Contains(string(body), marker) {
		t.Fatalf("after dropping the key: %d %s, want the unreadable-record problem", resp.StatusCode, body)
	}
	if runs.Load() != 1 {
		t.Fatalf("the upstream ran %d times, want 1", runs.Load())
	}
}
