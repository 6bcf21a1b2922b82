package idempotency

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// Every problem the handler can answer, written as problem+json or handed
// to handle_errors, tells caches not to keep it: a refusal must not be
// served again to the retry that the problem itself asks for.
func TestProblemsAreNotStored(t *testing.T) {
	ps := newProblems(app.DefaultProblemBase, &keySource{header: "Idempotency-Key", where: "the Idempotency-Key request header", what: "The Idempotency-Key header"}, 1, 1<<20)
	errorRoutes := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	for kind, p := range ps {
		// Every kind, so that a problem added later is covered too.
		name := problemTable[kind].anchor
		for _, srv := range []*caddyhttp.Server{nil, errorRoutes} {
			req, repl := withReplacer(post("/p", "k", ""))
			if srv != nil {
				req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, srv))
			}
			w := httptest.NewRecorder()
			if err := p.answer(w, req, repl); err != nil {
				t.Fatalf("%s with error routes %t: answer returned %v", name, srv != nil, err)
			}
			if cc := w.Header().Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-store" {
				t.Errorf("%s with error routes %t: Cache-Control %q, want no-store", name, srv != nil, cc)
			}
		}
	}
}

// With error routes that write nothing for it (another site's, or this
// site's for other statuses), a refusal is still the problem, and the
// routes saw its parts in placeholders.
func TestRefusalsThroughErrorRoutesThatWriteNothing(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{blockers: make(chan struct{})}
	defer close(b.blockers)
	go do(h, b, post("/p", "k", "x"))
	waitFor(t, func() bool { return b.runs.Load() == 1 })

	srv := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	req := post("/p", "k", "x")
	req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, srv))
	r := do(h, b, req)
	wantProblem(t, r, 409, "A request is outstanding for this Idempotency-Key")
	if r.Header().Get("Retry-After") == "" {
		t.Fatalf("headers %v lack Retry-After", r.Header())
	}
	if got := r.placeholder("http.idempotency.problem.title"); got != "A request is outstanding for this Idempotency-Key" {
		t.Fatalf("title placeholder %q", got)
	}
	if got := r.placeholder("http.idempotency.problem.body"); !strings.Contains(got, `"status":409`) {
		t.Fatalf("body placeholder %q", got)
	}
	if got := r.placeholder("http.error.status_code"); got != "409" {
		t.Fatalf("http.error.status_code %q", got)
	}
}
