package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// tracer is a tracer provider of its own, as Caddy's tracing handler
// keeps one, whose spans the test reads.
type tracer struct {
	tp  *sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func newTracer(t *testing.T, opts ...sdktrace.TracerProviderOption) *tracer {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithSpanProcessor(rec))...)
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return &tracer{tp: tp, rec: rec}
}

// serve sends req through h inside a server span, as the tracing handler
// would, and returns the answer and that span.
func (tr *tracer) serve(h *Handler, next *backend, req *http.Request) (response, trace.Span) {
	ctx, span := tr.tp.Tracer("caddy").Start(req.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	r := do(h, next, req.WithContext(ctx))
	span.End()
	return r, span
}

// children returns the ended spans whose parent is parent, by name.
func (tr *tracer) children(parent trace.SpanContext) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range tr.rec.Ended() {
		if s.Parent().SpanID() == parent.SpanID() {
			out[s.Name()] = append(out[s.Name()], s)
		}
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value.Emit()
	}
	return out
}

// wantSpan checks that the span is the only one of its name, with the
// attributes given (and perhaps others).
func wantSpan(t *testing.T, spans map[string][]sdktrace.ReadOnlySpan, name string, want map[attribute.Key]string) sdktrace.ReadOnlySpan {
	t.Helper()
	if len(spans[name]) != 1 {
		t.Fatalf("%d %s spans, want 1; spans: %v", len(spans[name]), name, spans)
	}
	s := spans[name][0]
	got := attrs(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q (attributes %v)", name, k, got[k], v, got)
		}
	}
	return s
}

// Under a recording span, each store call of a request is a child span of
// it, from the span's own tracer provider, with bounded attributes: the
// store, what it found and how the call ended, never the key or a body.
func TestStoreCallsAreChildSpans(t *testing.T) {
	tr := newTracer(t)
	global := newTracer(t)
	otel.SetTracerProvider(global.tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	h := provision(t, json.RawMessage(`{"module":"memory","max_entries":9801,"name":"traced memory"}`), nil)
	b := &backend{}
	const key, body = "trace-key-7f3a", `{"card":"4242-secret"}`
	named := map[attribute.Key]string{attrStore: "traced memory", attrModule: "memory"}

	r, first := tr.serve(h, b, post("/orders", key, body))
	wantStatus(t, r, 201)
	spans := tr.children(first.SpanContext())
	wantSpan(t, spans, "idempotency.acquire", map[attribute.Key]string{attrState: "new", attrResult: "ok"})
	wantSpan(t, spans, "idempotency.complete", map[attribute.Key]string{attrResult: "ok"})
	for _, s := range tr.rec.Ended() {
		if s.SpanContext().TraceID() != first.SpanContext().TraceID() {
			t.Errorf("%s is in another trace", s.Name())
		}
		for k, v := range named {
			if attrs(s)[k] != v && s.Name() != "POST /orders" {
				t.Errorf("%s: %s = %q, want %q", s.Name(), k, attrs(s)[k], v)
			}
		}
	}

	r, replay := tr.serve(h, b, post("/orders", key, body))
	wantStatus(t, r, 201)
	spans = tr.children(replay.SpanContext())
	wantSpan(t, spans, "idempotency.acquire", map[attribute.Key]string{attrState: "completed", attrResult: "ok"})
	if len(spans) != 1 {
		t.Errorf("a replay made spans %v, want the acquire alone", spans)
	}

	// A 5xx releases the claim.
	failing := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusServiceUnavailable)
		return nil
	}}
	r, released := tr.serve(h, failing, post("/orders", "trace-key-5xx", body))
	wantStatus(t, r, 503)
	wantSpan(t, tr.children(released.SpanContext()), "idempotency.release", map[attribute.Key]string{attrResult: "ok"})

	hash := store.NewKey("", key).String()
	for _, s := range tr.rec.Ended() {
		for _, kv := range s.Attributes() {
			if v := kv.Value.Emit(); strings.Contains(v, key) || strings.Contains(v, hash) || strings.Contains(v, "4242") {
				t.Errorf("%s: attribute %s = %q holds the key or the body", s.Name(), kv.Key, v)
			}
		}
	}
	if n := len(global.rec.Ended()) + len(global.rec.Started()); n != 0 {
		t.Errorf("the global tracer provider got %d spans", n)
	}
}

// The completion runs after the client has left, without its cancellation,
// and still in its trace.
func TestCompletionAfterTheClientLeftIsInItsTrace(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		tr := newTracer(t)
		h := provision(t, raw, nil)
		ctx, leave := context.WithCancel(context.Background())
		b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
			leave()
			w.WriteHeader(http.StatusCreated)
			return nil
		}}
		req := post("/orders", "left-early", "x")
		_, span := tr.serve(h, b, req.WithContext(ctx))
		wantSpan(t, tr.children(span.SpanContext()), "idempotency.complete", map[attribute.Key]string{attrResult: "ok"})
		r := do(h, &backend{}, post("/orders", "left-early", "x"))
		if wantStatus(t, r, 201); r.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatal("the response of the client that left was not stored")
		}
	})
}

// A duplicate's wait is a span; its polls are the wait's children.
func TestWaitIsASpan(t *testing.T) {
	tr := newTracer(t)
	h := provision(t, storeConfigs[0].raw(t), waiting(10*time.Second))
	b := &backend{blockers: make(chan struct{})}
	owner := make(chan response)
	go func() { owner <- do(h, b, post("/orders", "w", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	go func() {
		time.Sleep(100 * time.Millisecond)
		close(b.blockers)
	}()
	r, dup := tr.serve(h, b, post("/orders", "w", "x"))
	wantStatus(t, r, 201)
	wantStatus(t, <-owner, 201)

	spans := tr.children(dup.SpanContext())
	wantSpan(t, spans, "idempotency.acquire", map[attribute.Key]string{attrState: "in_progress"})
	wait := wantSpan(t, spans, "idempotency.wait", map[attribute.Key]string{attrResult: "owner_finished"})
	polls := tr.children(wait.SpanContext())["idempotency.acquire"]
	if len(polls) == 0 || attrs(polls[len(polls)-1])[attrState] != "completed" {
		t.Fatalf("the wait's polls %v, want acquires that end on the completed record", polls)
	}
}

// A long request's renewals are spans of its trace.
func TestRenewalIsASpan(t *testing.T) {
	tr := newTracer(t)
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	b := &backend{blockers: make(chan struct{})}
	done := make(chan struct{})
	var span trace.Span
	go func() {
		defer close(done)
		_, span = tr.serve(h, b, post("/orders", "slow", "x"))
	}()
	waitFor(t, func() bool {
		return slices.ContainsFunc(tr.rec.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() == "idempotency.renew" })
	})
	close(b.blockers)
	<-done
	renewals := tr.children(span.SpanContext())["idempotency.renew"]
	if len(renewals) == 0 || attrs(renewals[0])[attrResult] != "ok" {
		t.Fatalf("renewal spans %v, want a successful one under the request's span", renewals)
	}
}

// A store error marks the span as an error, with no more than its kind.
func TestStoreErrorSpan(t *testing.T) {
	tr := newTracer(t)
	// One entry, held by a claim in flight: the next claim finds the table
	// full, which the memory store answers as unavailable.
	h := provision(t, json.RawMessage(`{"module":"memory","max_entries":1,"name":"full memory"}`), nil)
	b := &backend{blockers: make(chan struct{})}
	owner := make(chan response)
	go func() { owner <- do(h, b, post("/orders", "holder", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	r, span := tr.serve(h, b, post("/orders", "refused", "x"))
	close(b.blockers)
	<-owner
	wantProblem(t, r, 503, "Idempotency store unavailable")
	s := wantSpan(t, tr.children(span.SpanContext()), "idempotency.acquire", map[attribute.Key]string{attrResult: "unavailable", attrStore: "full memory"})
	if s.Status().Code != codes.Error || s.Status().Description != "unavailable" {
		t.Fatalf("status %+v, want an error described as unavailable", s.Status())
	}
	if _, ok := attrs(s)[attrState]; ok {
		t.Fatal("a failed acquire claims to have found a state")
	}
}

// Without a recording span (no tracing handler, or a trace that is not
// sampled) nothing is created: the provider here would record any span but
// the request's.
func TestNoSpansWithoutARecordingSpan(t *testing.T) {
	tr := newTracer(t, sdktrace.WithSampler(allButRequests{}))
	h := provision(t, storeConfigs[0].raw(t), nil)
	r, span := tr.serve(h, &backend{}, post("/orders", "unsampled", "x"))
	wantStatus(t, r, 201)
	if span.IsRecording() {
		t.Fatal("the request's span records")
	}
	if n := len(tr.rec.Started()); n != 0 {
		t.Fatalf("%d spans started under a span that does not record", n)
	}
}

// allButRequests samples every span but the requests' own.
type allButRequests struct{}

func (allButRequests) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Name == "POST /orders" {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
}

func (allButRequests) Description() string { return "allButRequests" }
