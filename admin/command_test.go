package admin

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/internal/admintest"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

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

// cliServer is the admin API on its own listener, for the command's
// output and errors.
func cliServer(t *testing.T, regs ...store.Registration) string {
	srv := admintest.Server(t, &adminAPI{stores: func() []store.Registration { return regs }})
	return "--address=" + srv.Listener.Addr().String()
}

func TestCommandOutput(t *testing.T) {
	mem := openMemory(t)
	admin := cliServer(t, store.Registration{Name: "orders", Module: "memory", Store: mem})
	ctx := context.Background()

	out := admintest.MustCLI(t, "stuck", admin)
	admintest.WantContains(t, out, "no claim in flight for 30s or longer in orders")

	// Two claims: the limit is reported.
	for _, k := range []string{"a", "b"} {
		if got, err := mem.Acquire(ctx, store.NewKey("", k), &store.Claim{Lease: time.Minute, Endpoint: "POST h/" + k, CreatedAt: time.Now()}); got.Record != nil || err != nil {
			t.Fatal(got.Record, err)
		}
	}
	out = admintest.MustCLI(t, "stuck", admin, "--older-than=0s", "--limit=1")
	admintest.WantContains(t, out, "(the first 1; there may be more: raise --limit)")
	out = admintest.MustCLI(t, "stuck", admin, "--older-than=0s", "--limit=5")
	if strings.Contains(out, "there may be more") || strings.Count(out, "POST h/") != 2 {
		t.Fatalf("stuck --limit=5 with 2 claims:\n%s", out)
	}
	out = admintest.MustCLI(t, "stuck", admin, "--older-than=0s", "--json")
	var list StuckList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Claims) != 2 {
		t.Fatalf("stuck --json = %s (%v)", out, err)
	}

	// A completed record without expiry cannot be made here; a truncated
	// one is shown as not replayable.
	k := store.NewKey("tenant-7", "big")
	c := &store.Claim{Token: store.Token{1}, Lease: time.Minute, Endpoint: "POST h/big", CreatedAt: time.Now()}
	mem.Acquire(ctx, k, c)
	mem.Complete(ctx, k, c, &store.Response{Status: 200, Truncated: true}, time.Hour)
	out = admintest.MustCLI(t, "inspect", admin, "--scope", "tenant-7", "--key", "big")
	admintest.WantContains(t, out, "replayable  no (its response was over max_response_body")

	// An unknown outcome has no status, body or replay to show.
	k = store.NewKey("tenant-7", "lost")
	c = &store.Claim{Token: store.Token{2}, Lease: time.Minute, Endpoint: "POST h/lost", CreatedAt: time.Now()}
	mem.Acquire(ctx, k, c)
	mem.Complete(ctx, k, c, &store.Response{OutcomeUnknown: true}, time.Hour)
	out = admintest.MustCLI(t, "inspect", admin, "--scope", "tenant-7", "lost") // the key as the argument
	admintest.WantContains(t, out, "state     completed", "outcome   unknown: the request was sent upstream and got no answer; retries get 502", "expires   ")
	for _, row := range []string{"status", "body", "replayable"} {
		if strings.Contains(out, "\n"+row+" ") {
			t.Fatalf("inspect of an unknown outcome shows %s:\n%s", row, out)
		}
	}

	empty := cliServer(t)
	out = admintest.MustCLI(t, "stores", empty)
	admintest.WantContains(t, out, "no idempotency store is provisioned")
	out = admintest.MustCLI(t, "stores", empty, "--json")
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
		out, err := admintest.RunCLI(t, tc.args...)
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
		out := admintest.MustCLI(t, args...)
		if strings.ContainsAny(out, "\x1b\x07\r\u009b\u202e") {
			t.Errorf("%s printed control bytes: %q", args[0], out)
		}
		admintest.WantContains(t, out, `POST h/\x1b[2J\x1b]0;owned\a\r\n\u009b31m\u202e/x\\y`)
	}
	// --json too: the endpoint is JSON-escaped, bidirectional overrides and
	// C1 controls included, and decodes back to what the client sent.
	for _, args := range [][]string{{"stuck", admin, "--older-than=0s", "--json"}, {"inspect", admin, "evil", "--json"}} {
		out := admintest.MustCLI(t, args...)
		if strings.ContainsAny(out, "\x1b\x07\r\u009b\u202e") {
			t.Errorf("%s --json printed control or format characters: %q", args[0], out)
		}
		if !strings.Contains(out, `\u202e`) || !json.Valid([]byte(out)) {
			t.Errorf("%s --json = %q, want valid JSON with the override escaped", args[0], out)
		}
	}
}
