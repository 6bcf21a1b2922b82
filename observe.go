package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Every store call a handler makes is observed: timed, and counted when
// the store was unavailable (the metrics, unless disable_metrics), and a
// child span of the request's span when a route runs under Caddy's
// tracing handler. Spans come from the tracer provider of the request's
// span, not from OpenTelemetry's global one (Caddy keeps its own); without
// a recording span nothing is created, and a call pays one context
// lookup. Labels and attributes are bounded: the store's name and module,
// the operation, what a call found and how it ended; never a key, a path
// or a body.
const tracerName = "github.com/caddy-idempotency/caddy-idempotency"

const (
	attrStore  = attribute.Key("idempotency.store")
	attrModule = attribute.Key("idempotency.store.module")
	attrResult = attribute.Key("idempotency.result")
	attrState  = attribute.Key("idempotency.state")
	// attrTookOver marks an acquire that took over a dead owner's claim.
	attrTookOver = attribute.Key("idempotency.took_over")
)

// operation is one of the store's methods.
type operation uint8

const (
	opAcquire operation = iota
	opComplete
	opRelease
	opRenew
	numOperations
)

var operations = [numOperations]struct{ label, span string }{
	opAcquire:  {"acquire", "idempotency.acquire"},
	opComplete: {"complete", "idempotency.complete"},
	opRelease:  {"release", "idempotency.release"},
	opRenew:    {"renew", "idempotency.renew"},
}

// observed is a store whose calls are observed.
type observed struct {
	store.Store
	attrs []attribute.KeyValue // the store's name and module
	// The latency and failure metrics of each operation; nil without
	// metrics.
	latency  [numOperations]prometheus.Observer
	failures [numOperations]prometheus.Counter
}

// observe wraps s, the store that reg names, with metrics if timed.
func observe(s store.Store, reg store.Registration, timed bool) *observed {
	o := &observed{Store: s, attrs: []attribute.KeyValue{attrStore.String(reg.Name), attrModule.String(reg.Module)}}
	if timed {
		for op, names := range operations {
			o.latency[op] = collectors.storeOps.WithLabelValues(reg.Name, names.label)
			o.failures[op] = collectors.storeErrs.WithLabelValues(reg.Name, names.label)
		}
	}
	return o
}

// begin starts observing a call of op under ctx: the span, if the request
// records one, and the clock.
func (o *observed) begin(ctx context.Context, op operation) (context.Context, trace.Span, time.Time) {
	ctx, span := startSpan(ctx, operations[op].span, o.attrs)
	var start time.Time
	if o.latency[op] != nil {
		start = time.Now()
	}
	return ctx, span, start
}

// end records how the call that begin started ended. A failure counts
// unless the caller's context ended it: a client that left is no store
// outage. The span's status leaves the error's text out: a backend's
// message may quote what it was sent.
func (o *observed) end(ctx context.Context, op operation, span trace.Span, start time.Time, err error) {
	if o.latency[op] != nil {
		o.latency[op].Observe(time.Since(start).Seconds())
		if errors.Is(err, store.ErrUnavailable) && ctx.Err() == nil {
			o.failures[op].Inc()
		}
	}
	if span == nil {
		return
	}
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotOwner):
		result = "not_owner"
	case errors.Is(err, store.ErrUnavailable):
		result = "unavailable"
	default:
		result = "error"
	}
	span.SetAttributes(attrResult.String(result))
	if err != nil && result != "not_owner" {
		span.SetStatus(codes.Error, result)
	}
	span.End()
}

func (o *observed) Acquire(ctx context.Context, k store.Key, c *store.Claim) (store.Acquired, error) {
	ctx, span, start := o.begin(ctx, opAcquire)
	got, err := o.Store.Acquire(ctx, k, c)
	if span != nil && err == nil {
		state := "new"
		if got.Record != nil {
			state = got.Record.State.String()
		}
		span.SetAttributes(attrState.String(state))
		if got.TookOver {
			span.SetAttributes(attrTookOver.Bool(true))
		}
	}
	o.end(ctx, opAcquire, span, start, err)
	return got, err
}

func (o *observed) Complete(ctx context.Context, k store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	ctx, span, start := o.begin(ctx, opComplete)
	err := o.Store.Complete(ctx, k, c, resp, ttl)
	o.end(ctx, opComplete, span, start, err)
	return err
}

func (o *observed) Release(ctx context.Context, k store.Key, tok store.Token) error {
	ctx, span, start := o.begin(ctx, opRelease)
	err := o.Store.Release(ctx, k, tok)
	o.end(ctx, opRelease, span, start, err)
	return err
}

func (o *observed) Renew(ctx context.Context, k store.Key, tok store.Token, lease time.Duration) error {
	ctx, span, start := o.begin(ctx, opRenew)
	err := o.Store.Renew(ctx, k, tok, lease)
	o.end(ctx, opRenew, span, start, err)
	return err
}

// startSpan starts a child span of the recording span in ctx, or returns
// ctx and a nil span when there is none.
func startSpan(ctx context.Context, name string, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endWait ends the span of a duplicate's wait (on_conflict wait) with how
// the wait ended: owner_finished (the first request's record answers it),
// owner_released (the first request released its claim, and this one runs
// instead), timeout, client_left or store_error.
func endWait(span trace.Span, result string) {
	if span == nil {
		return
	}
	span.SetAttributes(attrResult.String(result))
	if result == "store_error" {
		span.SetStatus(codes.Error, result)
	}
	span.End()
}

// detached is the context of the store calls made for a request once its
// client may be gone (completion, release, their retries, renewals): none
// of the request's cancellation or values, only its span, when it records,
// so that those calls' spans join the request's trace.
func detached(ctx context.Context) context.Context {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		return trace.ContextWithSpan(context.Background(), span)
	}
	return context.Background()
}

// Interface guard
var _ store.Store = (*observed)(nil)
