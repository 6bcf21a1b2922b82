package postgres

import (
	"context"
	"time"
)

// callTimeout bounds one store call, waiting for a pooled connection
// included: the handler's calls after a response carry no deadline of
// their own, and a stalled server must not hold a request (or the claim it
// renews) for ever. A variable for tests.
var callTimeout = 5 * time.Second

// bound returns the context for a call that starts now under ctx, and its
// cancel: ctx itself if its deadline is within callTimeout, or else one
// that ends callTimeout from now. That one does not end with ctx: a
// cancellation without a deadline, such as a client going away, lets the
// statement run on, bounded all the same, as a Redis command runs on.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if at, ok := ctx.Deadline(); ok && time.Until(at) <= callTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
}
