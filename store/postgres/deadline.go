package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// callTimeout bounds one store call, waiting for a pooled connection
// included: the handler's calls after a response carry no deadline of
// their own, and a stalled server must not hold a request (or the claim it
// renews) for ever. deadlineSlack is how much longer a call may run.
// Variables for tests; each database reads them once.
var (
	callTimeout   = 5 * time.Second
	deadlineSlack = time.Second
)

// Kept (issue 36): a context.WithTimeout per call cost 1.03 and 1.12 times
// the CPU per new key under bench/compare.sh (docs/performance.md).
//
// deadlines bounds store calls without a timer each: a timeout context per
// call costs a timer and its allocations, and under a request's context a
// registration as its child. Instead, the calls that start within
// deadlineSlack of each other share a context, whose deadline is
// callTimeout to callTimeout+deadlineSlack after the start of each: one
// timer a second under load, none when idle. A caller's own deadline
// within callTimeout stands.
//
// The shared context does not end with the caller's: a cancellation
// without a deadline, such as a client going away, lets the statement run
// on, bounded all the same, as a Redis command runs on.
type deadlines struct {
	timeout, slack time.Duration
	cur            atomic.Pointer[deadline]
	mu             sync.Mutex // serializes the making of the next deadline
}

func newDeadlines() *deadlines {
	return &deadlines{timeout: callTimeout, slack: deadlineSlack}
}

type deadline struct {
	ctx    context.Context
	at     time.Time
	cancel context.CancelFunc
}

// bound returns the context for a call that starts now under ctx.
func (d *deadlines) bound(ctx context.Context) context.Context {
	now := time.Now()
	if at, ok := ctx.Deadline(); ok && at.Sub(now) <= d.timeout {
		return ctx
	}
	if cur := d.cur.Load(); cur != nil && cur.at.Sub(now) >= d.timeout {
		return cur.ctx
	}
	return d.next(now)
}

func (d *deadlines) next(now time.Time) context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.cur.Load(); cur != nil && cur.at.Sub(now) >= d.timeout {
		return cur.ctx
	}
	// The previous context ends by its own deadline: calls may still use
	// it.
	at := now.Add(d.timeout + d.slack)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	d.cur.Store(&deadline{ctx: ctx, at: at, cancel: cancel})
	return ctx
}

// stop ends the current context, for a store that is closing.
func (d *deadlines) stop() {
	if cur := d.cur.Load(); cur != nil {
		cur.cancel()
	}
}
