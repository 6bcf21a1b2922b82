package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Spans: when a route runs under Caddy's tracing handler, every store call
// made for a request is a child span of the request's span, taken from the
// tracer provider of that span, not from OpenTelemetry's global one (Caddy
// keeps its own). Without a recording span in the request's context
// nothing is created: a route without tracing pays one context lookup per
// store call. Attributes are bounded: the store's name and module, what a
// call found and how it ended; never a key, a path or a body.
const tracerName = "github.com/caddy-idempotency/caddy-idempotency"

const (
	attrStore  = attribute.Key("idempotency.store")
	attrModule = attribute.Key("idempotency.store.module")
	attrResult = attribute.Key("idempotency.result")
	attrState  = attribute.Key("idempotency.state")
	// attrTookOver marks an acquire that took over a dead owner's claim.
	attrTookOver = attribute.Key("idempotency.took_over")
)

// startSpan starts a child span of the recording span in ctx, or returns
// ctx and a nil span when there is none.
func startSpan(ctx context.Context, name string, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends a store call's span with how the call ended. The error's
// text is left out: a backend's message may quote what it was sent.
func endSpan(span trace.Span, err error) {
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

// traced makes a span of every store call made under a recording span.
type traced struct {
	store.Store
	attrs []attribute.KeyValue // the store's name and module
}

// traceStore wraps s (loaded, or wrapping the loaded store), named name.
func traceStore(s, loaded store.Store, name string) *traced {
	attrs := []attribute.KeyValue{attrStore.String(name)}
	if m, ok := loaded.(caddy.Module); ok {
		attrs = append(attrs, attrModule.String(m.CaddyModule().ID.Name()))
	}
	return &traced{Store: s, attrs: attrs}
}

func (t *traced) Acquire(ctx context.Context, k store.Key, c *store.Claim) (*store.Record, error) {
	ctx, span := startSpan(ctx, "idempotency.acquire", t.attrs)
	rec, err := t.Store.Acquire(ctx, k, c)
	if span != nil {
		if err == nil {
			span.SetAttributes(stateFound(rec))
			if rec == nil && c.TookOver {
				span.SetAttributes(attrTookOver.Bool(true))
			}
		}
		endSpan(span, err)
	}
	return rec, err
}

// stateFound is what an Acquire found: "new" when it claimed the key.
func stateFound(rec *store.Record) attribute.KeyValue {
	if rec == nil {
		return attrState.String("new")
	}
	return attrState.String(rec.State.String())
}

func (t *traced) Complete(ctx context.Context, k store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	ctx, span := startSpan(ctx, "idempotency.complete", t.attrs)
	err := t.Store.Complete(ctx, k, c, rec, ttl)
	if span != nil {
		endSpan(span, err)
	}
	return err
}

func (t *traced) Release(ctx context.Context, k store.Key, tok store.Token) error {
	ctx, span := startSpan(ctx, "idempotency.release", t.attrs)
	err := t.Store.Release(ctx, k, tok)
	if span != nil {
		endSpan(span, err)
	}
	return err
}

func (t *traced) Renew(ctx context.Context, k store.Key, tok store.Token, lease time.Duration) error {
	ctx, span := startSpan(ctx, "idempotency.renew", t.attrs)
	err := t.Store.Renew(ctx, k, tok, lease)
	if span != nil {
		endSpan(span, err)
	}
	return err
}

// Interface guard
var _ store.Store = (*traced)(nil)
