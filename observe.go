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

// Store calls are timed and their outages counted (unless disable_metrics),
// and traced under the request's span when it records, with that span's
// tracer provider: Caddy keeps its own, not OpenTelemetry's global one.
// Labels and attributes never hold a key, a path or a body.
const tracerName = "github.com/caddy-idempotency/caddy-idempotency"

const (
	attrStore    = attribute.Key("idempotency.store")
	attrModule   = attribute.Key("idempotency.store.module")
	attrResult   = attribute.Key("idempotency.result")
	attrState    = attribute.Key("idempotency.state")
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

type observed struct {
	store.Store
	attrs []attribute.KeyValue // the store's name and module
	// per operation; nil without metrics
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

// begin starts a call's span, if the request records one, and its clock.
func (o *observed) begin(ctx context.Context, op operation) (context.Context, trace.Span, time.Time) {
	ctx, span := startSpan(ctx, operations[op].span, o.attrs)
	var start time.Time
	if o.latency[op] != nil {
		start = time.Now()
	}
	return ctx, span, start
}

// end records how the call ended. A failure counts unless the caller's
// context ended it: a client that left is no store outage. The span's status
// omits the error's text, which may quote what the backend was sent.
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

// startSpan starts a child of ctx's recording span, or returns a nil span.
func startSpan(ctx context.Context, name string, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endWait ends the span of a duplicate's wait with how the wait ended.
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

// detached is the context of store calls made once the client may be gone:
// only the request's recording span, so that those calls join its trace.
func detached(ctx context.Context) context.Context {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		return trace.ContextWithSpan(context.Background(), span)
	}
	return context.Background()
}

// Interface guard
var _ store.Store = (*observed)(nil)
