// Package admintest serves the admin.api.idempotency routes and runs the
// caddy idempotency command in process, for the tests of the admin package
// and of the handler's records as the operator sees them.
package admintest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// Server serves a's routes as Caddy's admin endpoint does, errors
// included: an APIError's status, and {"error": message}.
func Server(t *testing.T, a caddy.AdminRouter) *httptest.Server {
	t.Helper()
	routes := a.Routes()
	if len(routes) != 1 || routes[0].Pattern != "/idempotency/" {
		t.Fatalf("routes %+v, want one for /idempotency/", routes)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(routes[0].Pattern, func(w http.ResponseWriter, r *http.Request) {
		err := routes[0].Handler.ServeHTTP(w, r)
		if err == nil {
			return
		}
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			apiErr = caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		apiErr.Message = apiErr.Err.Error()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(apiErr.HTTPStatus)
		json.NewEncoder(w).Encode(apiErr)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// Module is a new admin.api.idempotency module, which serves the stores
// of the registry.
func Module(t *testing.T) caddy.AdminRouter {
	t.Helper()
	mod, err := caddy.GetModule("admin.api.idempotency")
	if err != nil {
		t.Fatal(err)
	}
	return mod.New().(caddy.AdminRouter)
}

// Call sends method path to srv, checks the status and decodes the JSON
// answer into v (if not nil); it returns the raw answer.
func Call(t *testing.T, srv *httptest.Server, method, path string, status int, v any) string {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, path, body, err)
		}
	}
	return string(body)
}

// WantError checks that method path fails with status and a message that
// contains want.
func WantError(t *testing.T, srv *httptest.Server, method, path string, status int, want string) {
	t.Helper()
	var e struct{ Error string }
	Call(t, srv, method, path, status, &e)
	if !strings.Contains(e.Error, want) {
		t.Fatalf("%s %s: error %q, want it to contain %q", method, path, e.Error, want)
	}
}

// RunCLI runs `caddy idempotency <args>` in process, as the command
// registered with Caddy, and returns what it printed.
func RunCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := &cobra.Command{Use: "idempotency", SilenceUsage: true, SilenceErrors: true}
	caddycmd.Commands()["idempotency"].CobraFunc(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// MustCLI is RunCLI that fails the test on an error.
func MustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := RunCLI(t, args...)
	if err != nil {
		t.Fatalf("caddy idempotency %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("$ caddy idempotency %s\n%s", strings.Join(args, " "), out)
	return out
}

// WantContains checks that out holds each of parts.
func WantContains(t *testing.T, out string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(out, p) {
			t.Fatalf("output lacks %q:\n%s", p, out)
		}
	}
}
