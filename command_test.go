package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// runCLI runs `caddy idempotency <args>` in process and returns what it
// printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := &cobra.Command{Use: "idempotency", SilenceUsage: true, SilenceErrors: true}
	setupCommand(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runCLI(t, args...)
	if err != nil {
		t.Fatalf("caddy idempotency %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("$ caddy idempotency %s\n%s", strings.Join(args, " "), out)
	return out
}

func wantContains(t *testing.T, out string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(out, p) {
			t.Fatalf("output lacks %q:\n%s", p, out)
		}
	}
}

func TestCommandIsRegistered(t *testing.T) {
	cmd, ok := caddycmd.Commands()["idempotency"]
	if !ok || cmd.CobraFunc == nil {
		t.Fatal("the idempotency command is not registered")
	}
	root := &cobra.Command{Use: "idempotency"}
	cmd.CobraFunc(root)
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
	}
	if strings.Join(names, " ") != "inspect purge stores stuck" {
		t.Fatalf("subcommands %v", names)
	}
	for _, f := range []string{"address", "config", "adapter", "store", "json"} {
		if root.PersistentFlags().Lookup(f) == nil {
			t.Errorf("no --%s flag", f)
		}
	}
}

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
	admin := "--address=localhost:2999"
	post := func(path, key string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://localhost:9680"+path, strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Idempotency-Key", key)
		return tester.AssertResponseCode(req, http.StatusCreated)
	}

	out := mustCLI(t, "stores", admin)
	wantContains(t, out, "NAME", "MODULE", name+"  ", "\norders  ")
	var stores []storeInfo
	if err := json.Unmarshal([]byte(mustCLI(t, "stores", admin, "--json")), &stores); err != nil ||
		!slices.Contains(stores, storeInfo{Name: name, Module: "memory", Inspector: true}) ||
		!slices.Contains(stores, storeInfo{Name: "orders", Module: "memory", Inspector: true}) {
		t.Fatalf("stores --json = %+v (%v), want both memory stores by name", stores, err)
	}

	// The named store is chosen by its name, and holds its own records.
	post("/named/orders", "n-1")
	out = mustCLI(t, "inspect", admin, "--store", "orders", "--key", "n-1")
	wantContains(t, out, "store       orders", "endpoint    POST localhost/named/orders")
	if _, err := runCLI(t, "inspect", admin, "--store", name, "--key", "n-1"); err == nil || !strings.Contains(err.Error(), "no record") {
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
	out = mustCLI(t, "inspect", admin, "--store", name, "--key", "order-1")
	wantContains(t, out, "store       "+name, "key         "+hash, "state       completed",
		"endpoint    POST localhost/orders", "status      201", "body        11 bytes", "replayable  yes", "ago)", "expires     ")

	out = mustCLI(t, "inspect", admin, "--store", name, "--hash", hash, "--json")
	var info keyInfo
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
	out = mustCLI(t, "stuck", admin, "--store", name, "--older-than", "0s")
	wantContains(t, out, "KEY", "AGE", "LEASE ENDS IN", "ENDPOINT", slow, "POST localhost/slow")
	if strings.Contains(out, hash) {
		t.Fatalf("stuck listed a completed record:\n%s", out)
	}
	out = mustCLI(t, "stuck", admin, "--store", name, "--older-than", "1h")
	wantContains(t, out, "no claim in flight for 1h or longer in "+name)
	out = mustCLI(t, "inspect", admin, "--store", name, "--hash", slow)
	wantContains(t, out, "state       in_progress", "lease ends  ")

	out = mustCLI(t, "purge", admin, "--store", name, "--key", "slow-1")
	wantContains(t, out, "purged "+slow+" from "+name)
	releaseOnce.Do(func() { close(release) })
	<-slowDone
	// The purged owner's response was not stored.
	if out, err := runCLI(t, "inspect", admin, "--store", name, "--hash", slow); err == nil || !strings.Contains(err.Error(), "no record for key "+slow) {
		t.Fatalf("inspect of a purged claim = %v\n%s", err, out)
	}

	// Purging the completed record lets its key run again.
	out = mustCLI(t, "purge", admin, "--store", name, "--hash", hash, "--json")
	var p purged
	if err := json.Unmarshal([]byte(out), &p); err != nil || p != (purged{Store: name, Key: hash, Deleted: true}) {
		t.Fatalf("purge --json = %s (%v)", out, err)
	}
	if _, err := runCLI(t, "purge", admin, "--store", name, "--hash", hash); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("second purge = %v, want no record", err)
	}
	before := runs.Load()
	post("/orders", "order-1")
	if runs.Load() != before+1 {
		t.Fatal("the purged key did not run again")
	}
}

// cliServer is the admin API on its own listener, for the command's
// output and errors.
func cliServer(t *testing.T, regs ...store.Registration) string {
	srv := adminServer(t, &adminAPI{stores: func() []store.Registration { return regs }})
	return "--address=" + srv.Listener.Addr().String()
}

func TestCommandOutput(t *testing.T) {
	mem := openMemory(t)
	admin := cliServer(t, store.Registration{Name: "orders", Module: "memory", Store: mem})
	ctx := context.Background()

	out := mustCLI(t, "stuck", admin)
	wantContains(t, out, "no claim in flight for 30s or longer in orders")

	// Two claims: the limit is reported.
	for _, k := range []string{"a", "b"} {
		if got, err := mem.Acquire(ctx, store.NewKey("", k), &store.Claim{Lease: time.Minute, Endpoint: "POST h/" + k, CreatedAt: time.Now()}); got.Record != nil || err != nil {
			t.Fatal(got.Record, err)
		}
	}
	out = mustCLI(t, "stuck", admin, "--older-than=0s", "--limit=1")
	wantContains(t, out, "(the first 1; there may be more: raise --limit)")
	out = mustCLI(t, "stuck", admin, "--older-than=0s", "--limit=5")
	if strings.Contains(out, "there may be more") || strings.Count(out, "POST h/") != 2 {
		t.Fatalf("stuck --limit=5 with 2 claims:\n%s", out)
	}
	out = mustCLI(t, "stuck", admin, "--older-than=0s", "--json")
	var list stuckList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Claims) != 2 {
		t.Fatalf("stuck --json = %s (%v)", out, err)
	}

	// A completed record without expiry cannot be made here; a truncated
	// one is shown as not replayable.
	k := store.NewKey("tenant-7", "big")
	c := &store.Claim{Token: store.Token{1}, Lease: time.Minute, Endpoint: "POST h/big", CreatedAt: time.Now()}
	mem.Acquire(ctx, k, c)
	mem.Complete(ctx, k, c, &store.Response{Status: 200, Truncated: true}, time.Hour)
	out = mustCLI(t, "inspect", admin, "--scope", "tenant-7", "--key", "big")
	wantContains(t, out, "replayable  no (its response was over max_response_body")

	// An unknown outcome has no status, body or replay to show.
	k = store.NewKey("tenant-7", "lost")
	c = &store.Claim{Token: store.Token{2}, Lease: time.Minute, Endpoint: "POST h/lost", CreatedAt: time.Now()}
	mem.Acquire(ctx, k, c)
	mem.Complete(ctx, k, c, &store.Response{OutcomeUnknown: true}, time.Hour)
	out = mustCLI(t, "inspect", admin, "--scope", "tenant-7", "lost") // the key as the argument
	wantContains(t, out, "state     completed", "outcome   unknown: the request was sent upstream and got no answer; retries get 502", "expires   ")
	for _, row := range []string{"status", "body", "replayable"} {
		if strings.Contains(out, "\n"+row+" ") {
			t.Fatalf("inspect of an unknown outcome shows %s:\n%s", row, out)
		}
	}

	empty := cliServer(t)
	out = mustCLI(t, "stores", empty)
	wantContains(t, out, "no idempotency store is provisioned")
	out = mustCLI(t, "stores", empty, "--json")
	if strings.TrimSpace(out) != "[]" {
		t.Fatalf("stores --json with none = %q", out)
	}
}

func TestCommandErrors(t *testing.T) {
	mem := openMemory(t)
	admin := cliServer(t, store.Registration{Name: "orders", Module: "memory", Store: mem}, store.Registration{Name: "payments", Module: "memory", Store: mem})

	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "--address=" + l.Addr().String()
	l.Close()

	// A Caddy without the module answers 404 in plain text.
	bare := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(bare.Close)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", admin}, "which key? caddy idempotency inspect <key> [--scope <scope>], or --hash <hash>"},
		{[]string{"inspect", admin, "--hash", "abc", "--key", "k"}, "none of the others can be"},
		{[]string{"inspect", admin, "--hash", "abc", "def"}, "give the key once"},
		{[]string{"inspect", admin, "a", "b"}, `one key, not 2 words: caddy idempotency inspect <key> [--scope <scope>], or --hash <hash>; quote a key that holds spaces`},
		{[]string{"purge", admin, "a", "b", "c"}, `one key, not 3 words: caddy idempotency purge <key> [--scope <scope>], or --hash <hash>`},
		{[]string{"inspect", admin, "--key", "k", "k"}, "give the key once"},
		{[]string{"inspect", admin, "--store", "orders", "two words"}, "not a valid Idempotency-Key"},
		{[]string{"inspect", admin, "--store", "orders", store.NewKey("", "k").String()}, "if " + store.NewKey("", "k").String()[:8] + "… is a key hash from a log, use --hash " + store.NewKey("", "k").String()},
		{[]string{"inspect", admin, "--store", "orders", "--hash", "abc"}, "not a key hash"},
		{[]string{"inspect", admin, "--key", "k"}, "2 stores are provisioned; choose one with store=<name> (--store on the command line): orders, payments"},
		{[]string{"purge", admin, "--store", "memory", "--key", "k"}, "2 memory stores are provisioned"},
		{[]string{"purge", admin, "--store", "orders", "--key", "k"}, "no record for key " + store.NewKey("", "k").String() + " in store orders"},
		{[]string{"stuck", admin, "--store", "orders", "--older-than", "soon"}, "older_than"},
		{[]string{"stuck", admin, "--store", "orders", "--limit", "0"}, "limit"},
		{[]string{"stuck", admin, "extra"}, "unknown command"},
		{[]string{"stores", dead}, "is Caddy running"},
		{[]string{"stores", "--address=" + bare.Listener.Addr().String()}, "is this Caddy built with the idempotency module?"},
		{[]string{"stores", "--address=localhost:1-5"}, "invalid admin address"},
	} {
		out, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("caddy idempotency %s = %v, want an error containing %q\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for in, want := range map[string]string{
		"12ms": "12ms", "1.4s": "1s", "59.989s": "1m", "1h0m0s": "1h", "23h59m57.2s": "23h59m57s",
		"2m30.5s": "2m31s", "3h5m0s": "3h5m", "1h0m1s": "1h0m1s", "junk": "junk",
	} {
		if got := shortDuration(in); got != want {
			t.Errorf("shortDuration(%q) = %q, want %q", in, got, want)
		}
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

	admin := "--address=localhost:2999"
	hash := store.NewKey(rawScope, rawKey).String()
	name := "--store=cli-9718"
	wantContains(t, mustCLI(t, "inspect", admin, name, "--scope", rawScope, "--key", rawKey), "key         "+hash)
	wantContains(t, mustCLI(t, "inspect", admin, name, "--scope", rawScope, rawKey), "key         "+hash)
	wantContains(t, mustCLI(t, "inspect", admin, name, "--scope", rawScope, `"`+rawKey+`"`), "key         "+hash) // the RFC 8941 spelling
	wantContains(t, mustCLI(t, "purge", admin, name, "--scope", rawScope, rawKey), "purged "+hash)

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

// The stored endpoint is what a client sent: printed raw, a path holding
// an escape sequence would drive the operator's terminal.
func TestCommandEscapesControlBytes(t *testing.T) {
	mem := openMemory(t)
	admin := cliServer(t, store.Registration{Name: "orders", Module: "memory", Store: mem})
	ctx := context.Background()
	k := store.NewKey("", "evil")
	endpoint := "POST h/\x1b[2J\x1b]0;owned\x07\r\n\u009b31m\u202e/x\\y"
	c := &store.Claim{Token: store.Token{3}, Lease: time.Minute, Endpoint: endpoint, CreatedAt: time.Now()}
	if got, err := mem.Acquire(ctx, k, c); got.Record != nil || err != nil {
		t.Fatal(got.Record, err)
	}
	for _, args := range [][]string{{"stuck", admin, "--older-than=0s"}, {"inspect", admin, "evil"}} {
		out := mustCLI(t, args...)
		if strings.ContainsAny(out, "\x1b\x07\r\u009b\u202e") {
			t.Errorf("%s printed control bytes: %q", args[0], out)
		}
		wantContains(t, out, `POST h/\x1b[2J\x1b]0;owned\a\r\n\u009b31m\u202e/x\\y`)
	}
	// --json too: the endpoint is JSON-escaped, bidirectional overrides and
	// C1 controls included, and decodes back to what the client sent.
	for _, args := range [][]string{{"stuck", admin, "--older-than=0s", "--json"}, {"inspect", admin, "evil", "--json"}} {
		out := mustCLI(t, args...)
		if strings.ContainsAny(out, "\x1b\x07\r\u009b\u202e") {
			t.Errorf("%s --json printed control or format characters: %q", args[0], out)
		}
		if !strings.Contains(out, `\u202e`) || !json.Valid([]byte(out)) {
			t.Errorf("%s --json = %q, want valid JSON with the override escaped", args[0], out)
		}
	}
}
