package idempotency

import (
	"bytes"
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// background bounds the store calls retried after their request has ended,
// for the whole process (every handler of every config), so that a long
// outage under load cannot pile up goroutines; past the bound, leases
// expire claims as they always would.
var background = make(chan struct{}, 64)

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

// release gives a claim back, so that the retry runs the request anew. When
// the store fails, the claim is withdrawn in the background, as a response
// the store refused is stored later (completeLater): until the claim's
// lease passes, after which the lease has settled the matter anyway.
func (h *Handler) release(ctx context.Context, key store.Key, tok store.Token, why string) {
	err := h.store.Release(ctx, key, tok)
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		h.logger.Warn("releasing the claim failed; retrying until the lease passes",
			zap.String("key_hash", key.String()), zap.String("reason", why), zap.Error(err))
		h.withdraw(ctx, key, tok)
	}
}

// withdraw releases a claim whose Acquire or Release failed. A timed-out
// claim may still land once the store recovers (the command was only
// delayed); left alone, it would answer the client's retry with 409 for a
// whole lease although nothing runs. Commands on other connections are not
// ordered with the delayed one, so the release is repeated until the store
// has answered twice (the second answer comes after the backlog that held
// the claim) or the claim was removed. The token is unique to this
// request, so a release can only ever remove this claim.
func (h *Handler) withdraw(ctx context.Context, key store.Key, tok store.Token) {
	answered := 0
	h.retryLater(ctx, func(ctx context.Context) error { return h.store.Release(ctx, key, tok) },
		func(err error) bool {
			if errors.Is(err, store.ErrNotOwner) {
				answered++
			}
			return err == nil || answered == 2
		})
}

// completeLater keeps trying to store a response the store refused while
// it was unavailable: until the lease passes, the claim is still this
// request's, and storing it spares the retry a second execution.
func (h *Handler) completeLater(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record) {
	kept := &store.Record{Status: rec.Status, Header: rec.Header.Clone(), Body: bytes.Clone(rec.Body),
		Truncated: rec.Truncated, OutcomeUnknown: rec.OutcomeUnknown}
	h.retryLater(ctx, func(ctx context.Context) error { return h.store.Complete(ctx, key, c, kept, time.Duration(h.TTL)) },
		func(err error) bool {
			switch {
			case err == nil:
				h.logger.Info("stored the response after the store recovered", zap.String("key_hash", key.String()))
			case errors.Is(err, store.ErrNotOwner):
				h.logger.Error("the store recovered too late: the lease passed before the response could be stored; a retry runs the request again",
					zap.String("key_hash", key.String()))
			default:
				return false
			}
			return true
		})
}

// retryLater calls op in the background, with a backoff from 100ms to 2s,
// until settled says its answer settles the matter or the claim's lease
// (which bounds what op can still change) has passed. Each call's context
// derives from parent, a request's detached context.
func (h *Handler) retryLater(parent context.Context, op func(context.Context) error, settled func(error) bool) {
	select {
	case background <- struct{}{}:
	default:
		return
	}
	deadline := time.Now().Add(time.Duration(h.LockTimeout))
	h.holds.Take(time.Duration(h.LockTimeout)) // while its request still holds one
	go func() {
		defer func() { <-background }()
		defer h.holds.Give()
		for pause := 100 * time.Millisecond; time.Now().Before(deadline); pause = min(2*pause, 2*time.Second) {
			ctx, cancel := context.WithDeadline(parent, deadline)
			err := op(ctx)
			cancel()
			if settled(err) {
				return
			}
			time.Sleep(pause)
		}
	}()
}
