package idempotency

import (
	"context"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Every problem the handler can answer, written as problem+json or handed
// to handle_errors, tells caches not to keep it: a refusal must not be
// served again to the retry that the problem itself asks for.
func TestProblemsAreNotStored(t *testing.T) {
	ps := reflect.ValueOf(newProblems("Idempotency-Key", 1<<20))
	errorRoutes := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	for i := range ps.NumField() {
		// Every field, so that a problem added later is covered too.
		p := (*problem)(ps.Field(i).UnsafePointer())
		name := ps.Type().Field(i).Name
		for _, srv := range []*caddyhttp.Server{nil, errorRoutes} {
			req, repl := withReplacer(post("/p", "k", ""))
			if srv != nil {
				req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, srv))
			}
			w := httptest.NewRecorder()
			err := p.answer(w, req, repl)
			if (err != nil) != (srv != nil) {
				t.Fatalf("%s with error routes %t: answer returned %v", name, srv != nil, err)
			}
			if cc := w.Header().Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-store" {
				t.Errorf("%s with error routes %t: Cache-Control %q, want no-store", name, srv != nil, cc)
			}
		}
	}
}

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
	if r.Header().Get("Retry-After") == "" || r.Header().Get("Cache-Control") != "no-store" || r.Body.Len() != 0 {
		t.Fatalf("error route gets headers %v and body %q; want Retry-After, Cache-Control: no-store and no body yet", r.Header(), r.Body)
	}
	if got := r.placeholder("http.idempotency.problem.title"); got != "A request is outstanding for this Idempotency-Key" {
		t.Fatalf("title placeholder %q", got)
	}
	if got := r.placeholder("http.idempotency.problem.body"); !strings.Contains(got, `"status":409`) {
		t.Fatalf("body placeholder %q", got)
	}
}
