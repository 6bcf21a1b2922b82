package idempotency

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestRefusalsBecomeErrorsForHandleErrors(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{blockers: make(chan struct{})}
	defer close(b.blockers)
	go do(h, b, post("/p", "k", "x"))
	waitFor(t, func() bool { return b.runs.Load() == 1 })

	srv := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	req := post("/p", "k", "x")
	req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, srv))
	r := do(h, b, req)
	var he caddyhttp.HandlerError
	if !errors.As(r.err, &he) || he.StatusCode != 409 {
		t.Fatalf("with error routes, a conflict returned %v, want a 409 HandlerError", r.err)
	}
	if r.Header().Get("Retry-After") == "" || r.Body.Len() != 0 {
		t.Fatalf("error route gets headers %v and body %q; want Retry-After and no body yet", r.Header(), r.Body)
	}
	if got := r.placeholder("http.idempotency.problem.title"); got != "A request is outstanding for this Idempotency-Key" {
		t.Fatalf("title placeholder %q", got)
	}
	if got := r.placeholder("http.idempotency.problem.body"); !strings.Contains(got, `"status":409`) {
		t.Fatalf("body placeholder %q", got)
	}
}
