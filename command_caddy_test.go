package idempotency

// The command against a Caddy that runs the handler, in this package:
// every test that starts Caddy with its admin endpoint on localhost:2999
// is in one test binary, so that none runs beside another.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-idempotency/caddy-idempotency/admin"
	"github.com/caddy-idempotency/caddy-idempotency/internal/admintest"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The command against a real Caddy, in process, through its admin
// endpoint (Origin and Host checks included): a record the handler made is
// inspected and purged, and a claim in flight is listed and purged.
func TestCommandAgainstCaddy(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	var releaseOnce sync.Once
	arrived := make(chan struct{}, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, runs.Load())
	}))
	defer upstream.Close()
	defer releaseOnce.Do(func() { close(release) })

	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9680
	https_port 9643
	grace_period 1ns
}
http://localhost:9680 {
	handle /named/* {
		idempotency {
			store memory {
				max_entries 9681
				name orders
			}
		}
		reverse_proxy %[1]s
	}
	handle {
		idempotency {
			store memory {
				name cli-9680
			}
		}
		reverse_proxy %[1]s
	}
}`, upstream.Listener.Addr()), "caddyfile")

	const name = "cli-9680"
	address := "--address=localhost:2999"
	post := func(path, key string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9680"+path, strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Idempotency-Key", key)
		return tester.AssertResponseCode(req, http.StatusCreated)
	}

	out := admintest.MustCLI(t, "stores", address)
	admintest.WantContains(t, out, "NAME", "MODULE", name+"  ", "\norders  ")
	var stores []admin.StoreInfo
	if err := json.Unmarshal([]byte(admintest.MustCLI(t, "stores", address, "--json")), &stores); err != nil ||
		!slices.Contains(stores, admin.StoreInfo{Name: name, Module: "memory", Inspector: true}) ||
		!slices.Contains(stores, admin.StoreInfo{Name: "orders", Module: "memory", Inspector: true}) {
		t.Fatalf("stores --json = %+v (%v), want both memory stores by name", stores, err)
	}

	// The named store is chosen by its name, and holds its own records.
	post("/named/orders", "n-1")
	out = admintest.MustCLI(t, "inspect", address, "--store", "orders", "--key", "n-1")
	admintest.WantContains(t, out, "store       orders", "endpoint    POST localhost/named/orders")
	if _, err := admintest.RunCLI(t, "inspect", address, "--store", name, "--key", "n-1"); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("the other store has the named store's key: %v", err)
	}

	// The metrics carry the same names.
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`caddy_idempotency_store_operation_duration_seconds_count{operation="acquire",store="orders"} 1`,
		`caddy_idempotency_store_operation_duration_seconds_count{operation="complete",store="orders"} 1`,
	} {
		if !strings.Contains(string(metricsText), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	post("/orders", "order-1")
	hash := store.NewKey("", "order-1").String()
	out = admintest.MustCLI(t, "inspect", address, "--store", name, "--key", "order-1")
	admintest.WantContains(t, out, "store       "+name, "key         "+hash, "state       completed",
		"endpoint    POST localhost/orders", "status      201", "body        11 bytes", "replayable  yes", "ago)", "expires     ")

	out = admintest.MustCLI(t, "inspect", address, "--store", name, "--hash", hash, "--json")
	var info admin.KeyInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("--json printed %q: %v", out, err)
	}
	if info.Key != hash || info.Store != name || info.Status != 201 || info.BodySize != 11 || !strings.Contains(out, "\n  \"state\": \"completed\"") {
		t.Fatalf("--json = %s", out)
	}

	// A claim in flight.
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		post("/slow", "slow-1")
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow request did not reach the upstream")
	}
	slow := store.NewKey("", "slow-1").String()
	out = admintest.MustCLI(t, "stuck", address, "--store", name, "--older-than", "0s")
	admintest.WantContains(t, out, "KEY", "AGE", "LEASE ENDS IN", "ENDPOINT", slow, "POST localhost/slow")
	if strings.Contains(out, hash) {
		t.Fatalf("stuck listed a completed record:\n%s", out)
	}
	out = admintest.MustCLI(t, "stuck", address, "--store", name, "--older-than", "1h")
	admintest.WantContains(t, out, "no claim in flight for 1h or longer in "+name)
	out = admintest.MustCLI(t, "inspect", address, "--store", name, "--hash", slow)
	admintest.WantContains(t, out, "state       in_progress", "lease ends  ")

	out = admintest.MustCLI(t, "purge", address, "--store", name, "--key", "slow-1")
	admintest.WantContains(t, out, "purged "+slow+" from "+name)
	releaseOnce.Do(func() { close(release) })
	<-slowDone
	// The purged owner's response was not stored.
	if out, err := admintest.RunCLI(t, "inspect", address, "--store", name, "--hash", slow); err == nil || !strings.Contains(err.Error(), "no record for key "+slow) {
		t.Fatalf("inspect of a admin.Purged claim = %v\n%s", err, out)
	}

	// Purging the completed record lets its key run again.
	out = admintest.MustCLI(t, "purge", address, "--store", name, "--hash", hash, "--json")
	var p admin.Purged
	if err := json.Unmarshal([]byte(out), &p); err != nil || p != (admin.Purged{Store: name, Key: hash, Deleted: true}) {
		t.Fatalf("purge --json = %s (%v)", out, err)
	}
	if _, err := admintest.RunCLI(t, "purge", address, "--store", name, "--hash", hash); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("second purge = %v, want no record", err)
	}
	before := runs.Load()
	post("/orders", "order-1")
	if runs.Load() != before+1 {
		t.Fatal("the admin.Purged key did not run again")
	}
}

// The command names a key to the admin API by its hash only: Caddy's admin
// logger writes every request's URI, and the raw key or scope must not
// reach a log. A purge is logged with the hash and who asked.
func TestCommandLogsNoRawKey(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	logFile := t.TempDir() + "/caddy.log"
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9718
	https_port 9748
	grace_period 1ns
	log {
		output file %s
		level INFO
	}
}
http://localhost:9718 {
	idempotency {
		scope {http.request.header.X-Tenant}
		store memory {
			name cli-9718
		}
	}
	reverse_proxy %s
}`, logFile, upstream.Listener.Addr()), "caddyfile")

	const rawKey, rawScope = "secret-key-5f1c", "tenant-9e2a"
	req, _ := http.NewRequest(http.MethodPost, "http://localhost:9718/orders", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", rawKey)
	req.Header.Set("X-Tenant", rawScope)
	tester.AssertResponseCode(req, http.StatusCreated)

	address := "--address=localhost:2999"
	hash := store.NewKey(rawScope, rawKey).String()
	name := "--store=cli-9718"
	admintest.WantContains(t, admintest.MustCLI(t, "inspect", address, name, "--scope", rawScope, "--key", rawKey), "key         "+hash)
	admintest.WantContains(t, admintest.MustCLI(t, "inspect", address, name, "--scope", rawScope, rawKey), "key         "+hash)
	admintest.WantContains(t, admintest.MustCLI(t, "inspect", address, name, "--scope", rawScope, `"`+rawKey+`"`), "key         "+hash) // the RFC 8941 spelling
	admintest.WantContains(t, admintest.MustCLI(t, "purge", address, name, "--scope", rawScope, rawKey), "purged "+hash)

	log, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{rawKey, rawScope} {
		if strings.Contains(string(log), raw) {
			t.Errorf("the log holds the raw %q:\n%s", raw, log)
		}
	}
	var purge map[string]any
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"purged`) {
			json.Unmarshal([]byte(line), &purge)
		}
	}
	if addr := fmt.Sprint(purge["remote_addr"]); purge["key_hash"] != hash ||
		!strings.HasPrefix(addr, "127.0.0.1:") && !strings.HasPrefix(addr, "[::1]:") {
		t.Fatalf("purge log entry %v, want the key hash and the caller's address\n%s", purge, log)
	}
}
