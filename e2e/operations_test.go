package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// The operator's view of a running binary: the metrics on Caddy's admin
// /metrics, and the `caddy idempotency` command against the admin API.
func TestMetricsAndAdminCommand(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient(t)
	for range 2 {
		send(t, cl, req(http.MethodPost, c.URL+"/orders", "ops-1", []byte(`{}`)))
	}
	send(t, cl, req(http.MethodPost, c.URL+"/orders", "ops-1", []byte(`{"other":1}`)))

	admin := fmt.Sprintf("127.0.0.1:%d", c.adminPort)
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`caddy_idempotency_requests_total{result="new"} 1`,
		`caddy_idempotency_requests_total{result="replay"} 1`,
		`caddy_idempotency_requests_total{result="mismatch"} 1`,
		`caddy_idempotency_store_operation_duration_seconds_count{operation="complete",store="memory"} 1`,
		`caddy_idempotency_in_flight_claims 0`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The default store's name reads as its config does.
	out, err := exec.Command(caddyBin, "idempotency", "stores", "--address", admin).CombinedOutput()
	if err != nil {
		t.Fatalf("caddy idempotency stores: %v\n%s", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 2 || strings.Join(strings.Fields(lines[1]), " ") != "memory memory" {
		t.Errorf("stores output, want the header and one memory store named memory:\n%s", out)
	}

	out, err = exec.Command(caddyBin, "idempotency", "inspect", "--address", admin, "--key", "ops-1").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy idempotency inspect: %v\n%s", err, out)
	}
	for _, want := range []string{"store       memory\n", "completed", "POST", "/orders", "201"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	if out, err := exec.Command(caddyBin, "idempotency", "purge", "--address", admin, "--key", "ops-1").CombinedOutput(); err != nil {
		t.Fatalf("caddy idempotency purge: %v\n%s", err, out)
	}
	// Purged: the key runs anew.
	res := send(t, cl, req(http.MethodPost, c.URL+"/orders", "ops-1", []byte(`{"other":1}`)))
	wantStatus(t, "request after the purge", res, http.StatusCreated)
	wantCount(t, "upstream runs", u.starts("ops-1"), 2)
}
