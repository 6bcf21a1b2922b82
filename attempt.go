package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// attempt is one keyed request on its way through the handler, with what
// every step of it needs. ServeHTTP makes it once the key is valid; here
// is the life of its claim: claimed (claimKey, acquire), run, then
// finished as decideClaimEnd (claim_end.go) says, and the calls that
// outlive the request (complete, release, keepUnknown, and their retries
// in the background). A duplicate waits in wait.go; a retry is answered
// from its record in replay.go.
type attempt struct {
	h        *Handler
	w        http.ResponseWriter
	r        *http.Request
	repl     *caddy.Replacer
	next     caddyhttp.Handler
	key      store.Key
	body     []byte // when read for the key (bodyRead)
	bodyRead bool
	claim    store.Claim
}

// claimKey claims the attempt's key, and runs, waits, replays or refuses
// the request as the store's answer says. (Apart from ServeHTTP's many
// returns, so that its defers stay cheap: open-coded.)
func (a *attempt) claimKey() error {
	h, r := a.h, a.r
	// From here the request uses the store, which a reload that replaces
	// it must leave open until the request and its background work are
	// done (store.Holds).
	h.holds.Add(h.lease)
	defer h.holds.Done()

	body := a.body
	if !a.bodyRead && h.payload.ReadsBody() { // else the body streams on, unread
		var tooLarge bool
		var err error
		if body, tooLarge, err = readBody(r, h.MaxRequestBody); err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
		if tooLarge {
			return a.refuse(problemTooLarge)
		}
	}

	a.repl.Set("http.idempotency.key", a.key) // hex-encoded only if a log asks
	if h.forwardKeyField != "" {
		r.Header[h.forwardKeyField] = []string{a.key.String()}
	}
	a.claim = store.Claim{
		Token:       store.NewToken(),
		Endpoint:    fingerprint.Endpoint(h.Endpoint, r, a.repl),
		Fingerprint: h.payload.Of(r, body),
		Lease:       h.lease,
		TTL:         h.ttl,
		KeepUnknown: h.OnUnknownOutcome == app.UnknownKeep,
	}
	got, err := a.acquire(r.Context())
	if got.TookOver {
		a.tookOver(got.Record)
	}
	switch rec := got.Record; {
	case a.waits(rec, err):
		return a.wait()
	case errors.Is(err, errClaimInFlight):
		return a.refuse(problemOutstanding)
	case err != nil:
		return a.storeFailed(err)
	case rec == nil:
		return a.run()
	default:
		return a.replay(rec)
	}
}

// waits reports whether the request waits, on a route that does, for a
// duplicate in flight: a claim of its key under way in this process, or one
// the store holds for the same endpoint and payload.
func (a *attempt) waits(rec *store.Record, err error) bool {
	if a.h.MaxWait <= 0 {
		return false
	}
	if errors.Is(err, errClaimInFlight) {
		return true
	}
	return err == nil && rec != nil && rec.State == store.InProgress && rec.BoundTo(&a.claim)
}

// acquire sends the attempt's claim to the store. The claim is dated as
// it is sent, each time: a won claim's lease is counted from then
// (leases.start).
//
// Within this process a key's claim waits for an earlier one that the
// store is slow to answer (claimsInFlight), and a claim the store failed is
// set to be withdrawn before the next is sent, which first lands the
// withdrawal: so no request here finds, as a dead owner's, a claim that
// this process sent and could not confirm.
//
// A claim won only after a third of its lease, when its first renewal is
// due, is renewed before it runs: the store may count its lease from when
// it was sent (Redis stamps it then, and a command held up on the way
// lands late), so a duplicate may already be free to take it over. If the
// renewal fails, the request does not run, as if the claim had failed.
func (a *attempt) acquire(ctx context.Context) (store.Acquired, error) {
	switch first, ok := claimsInFlight.begin(a.key); {
	case !ok:
		return store.Acquired{}, errClaimInFlight
	case first:
		defer claimsInFlight.end(a.key)
	}
	if !withdrawals.land(ctx, a.key) {
		return store.Acquired{}, errWithdrawalPending
	}
	a.claim.CreatedAt = time.Now()
	got, err := a.h.store.Acquire(ctx, a.key, &a.claim)
	if err == nil && got.Record == nil && time.Since(a.claim.CreatedAt) >= a.h.lease/renewFraction {
		renewed := time.Now()
		if err = a.h.store.Renew(ctx, a.key, a.claim.Token, a.h.lease); err != nil {
			err = store.Unavailable("acquiring", fmt.Errorf("the store confirmed the claim late, and renewing it failed: %w", err))
		}
		a.claim.CreatedAt = renewed
	}
	if _, unreadable := errors.AsType[*sealing.Unreadable](err); err != nil && !unreadable {
		a.withdraw() // the claim may have landed all the same
		return store.Acquired{}, err
	}
	return got, err
}

func (a *attempt) result(res result) { a.h.metrics.publish(a.repl, res) }

// refuse answers with the problem of that kind, counted as its result.
func (a *attempt) refuse(kind problemKind) error {
	p := a.h.problems[kind]
	a.result(p.result)
	return p.answer(a.w, a.r, a.repl)
}

// storeFailed answers a request whose claim the store could not take, per
// on_store_error (acquire withdraws the claim in case it lands late). A client
// that left while its claim waited (for a pooled connection, a slow reply)
// ends the call with its context: that is no store failure, and nobody is
// left to answer or to run the request for.
func (a *attempt) storeFailed(err error) error {
	h := a.h
	if u, ok := errors.AsType[*sealing.Unreadable](err); ok {
		// The request ran once already: it is not run again, and the
		// response is not replayed. Nothing was claimed.
		h.metrics.unreadable(u.Reason)
		h.logger.Error("the stored response cannot be read: "+u.Error()+"; refusing the request without running it again",
			zap.String("key_hash", a.key.String()), zap.String("reason", u.Reason),
			zap.String("key_id", u.KeyID), zap.Strings("configured_key_ids", h.keys.IDs()))
		return a.refuse(problemUnreadable)
	}
	if a.r.Context().Err() != nil {
		a.result(resultGone)
		a.w.WriteHeader(statusClientClosed) // for the access log, as reverse_proxy does
		return nil
	}
	if h.OnStoreError == app.FailOpen {
		a.result(resultError)
		h.logger.Warn("idempotency store unavailable; passing the request through unprotected (fail_open)",
			zap.String("key_hash", a.key.String()), zap.Error(err))
		return a.next.ServeHTTP(a.w, a.r)
	}
	h.logger.Error("idempotency store unavailable; refusing the request (fail_closed)",
		zap.String("key_hash", a.key.String()), zap.Error(err))
	return a.refuse(problemStoreUnavailable)
}

// tookOver notes that the key held a claim whose lease passed: its owner
// died while its request ran, here or on another instance. Without keep,
// the attempt's claim replaced it, and the request runs again; with keep,
// the store made it rec, its request's unknown outcome (Claim.KeepUnknown),
// which the attempt is answered from like any record.
func (a *attempt) tookOver(rec *store.Record) {
	a.h.metrics.tookOver()
	if rec != nil {
		a.h.logger.Warn("the claim of a request whose owner died while it ran is kept as its unknown outcome until its ttl (on_unknown_outcome keep)",
			zap.String("key_hash", a.key.String()))
		store.SignalEnd(a.key)
		return
	}
	a.h.logger.Info("took over the claim of a request whose lease passed; running it again",
		zap.String("key_hash", a.key.String()))
}

// run runs the request as the owner of the key's claim, and ends the claim
// with what it answered.
func (a *attempt) run() (err error) {
	h := a.h
	a.result(resultNew)
	rw := newRecorder(a.w, h.MaxResponseBody)
	if h.setsFirstHeaders() {
		rw.firstHeaders = h
	}
	h.metrics.claimHeld(1)
	defer h.metrics.claimHeld(-1)
	if h.OnUnknownOutcome == app.UnknownKeep && markEarlierUpstream(a.repl) {
		defer unmarkEarlierUpstream(a.repl)
	}
	lease, ctx := h.leases.start(a.r.Context(), a.key, a.claim.Token, a.claim.CreatedAt)
	after := detached(a.r.Context())
	// A panic (reverse_proxy's ErrAbortHandler when the client is gone)
	// still ends the claim, and goes on up.
	defer func() {
		if p := recover(); p != nil {
			h.leases.stop(lease)
			a.finish(after, rw, nil, true)
			panic(p)
		}
	}()
	err = a.next.ServeHTTP(rw, a.r.WithContext(ctx))
	if err == nil && !rw.wroteHeader {
		// The server would answer an empty 200 once this handler returns;
		// written here, it is marked as every first answer is. But
		// reverse_proxy before Caddy v2.11 returns nothing when its work is
		// cancelled: write the 499 later ones do, or it would pass for an
		// empty 200.
		status := http.StatusOK
		if ctx.Err() != nil {
			status = statusClientClosed
		}
		rw.WriteHeader(status)
	}
	h.leases.stop(lease) // before finishing, so a last renewal cannot race the release
	a.finish(after, rw, err, false)
	return err
}

// finish ends the claim of a request that has run, as decideClaimEnd says.
// ctx is detached from the client's: the response is stored for the
// retry whether or not the client stayed. Each store bounds its own calls.
func (a *attempt) finish(ctx context.Context, rw *recorder, handlerErr error, aborted bool) {
	defer store.SignalEnd(a.key)
	s := responseFacts{wroteHeader: rw.wroteHeader, status: rw.status, overflow: rw.overflow,
		handlerErr: handlerErr != nil, aborted: aborted}
	if !s.wroteHeader && (s.handlerErr || s.aborted) {
		s.reached = reachedUpstream(a.repl, handlerErr)
	}
	end, why := a.h.decideClaimEnd(s)
	switch end {
	case endStore:
		a.complete(ctx, rw.response())
	case endStoreTruncated:
		a.complete(ctx, &store.Response{Status: rw.status, Truncated: true})
	case endRelease:
		a.release(ctx, why)
	case endKeepUnknown:
		a.keepUnknown(ctx, why, handlerErr)
	}
}

// complete stores resp as the outcome of the claim's request, and keeps
// trying in the background if the store is away.
func (a *attempt) complete(ctx context.Context, resp *store.Response) {
	err := a.h.store.Complete(ctx, a.key, &a.claim, resp, a.h.ttl)
	switch {
	case errors.Is(err, store.ErrNotOwner):
		a.h.logger.Error("claim was lost before the response could be stored: the lease passed and another request took the key over (raise lock_timeout), or an operator purged it",
			zap.String("key_hash", a.key.String()))
	case err != nil:
		a.h.logger.Warn("storing the response failed; retrying until the lease passes",
			zap.String("key_hash", a.key.String()), zap.Error(err))
		a.completeLater(ctx, resp)
	}
}

// keepUnknown holds the key until ttl: its retries are told that the
// outcome is unknown rather than run again.
func (a *attempt) keepUnknown(ctx context.Context, why string, err error) {
	fields := []zap.Field{zap.String("key_hash", a.key.String()), zap.String("reason", why)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	a.h.logger.Warn("the upstream may have carried out the request, which got no answer; its key is kept until its ttl (on_unknown_outcome keep)", fields...)
	a.complete(ctx, &store.Response{OutcomeUnknown: true})
}

// release gives the claim back, so that the retry runs the request anew.
// When the store fails, the claim is withdrawn until the store takes it
// (withdraw.go).
func (a *attempt) release(ctx context.Context, why string) {
	err := a.h.store.Release(ctx, a.key, a.claim.Token)
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		a.h.logger.Warn("releasing the claim failed; withdrawing it until the store takes it",
			zap.String("key_hash", a.key.String()), zap.String("reason", why), zap.Error(err))
		a.withdraw()
	}
}

// completeLater keeps trying to store a response the store refused while
// it was unavailable: until the lease passes, the claim is still this
// request's, and storing it spares the retry a second execution. The
// response's header is copied.
func (a *attempt) completeLater(ctx context.Context, resp *store.Response) {
	h, key, claim := a.h, a.key, a.claim
	kept := *resp
	kept.Header = resp.Header.Clone()
	a.retryLater(ctx, func(ctx context.Context) error {
		return h.store.Complete(ctx, key, &claim, &kept, h.ttl)
	},
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

// background bounds the store calls retried after their request has ended,
// for the whole process (every handler of every config), so that a long
// outage under load cannot pile up goroutines; past the bound, leases
// expire claims as they always would.
var background = make(chan struct{}, 64)

// retryLater calls op in the background, with a backoff from 100ms to 2s,
// until settled says its answer settles the matter or the claim's lease
// (which bounds what op can still change) has passed. Each call's context
// derives from parent, a request's detached context.
func (a *attempt) retryLater(parent context.Context, op func(context.Context) error, settled func(error) bool) {
	select {
	case background <- struct{}{}:
	default:
		a.h.logger.Warn("no background slot to retry the store call: the claim expires by its lease instead",
			zap.String("key_hash", a.key.String()), zap.Int("slots", cap(background)))
		a.h.metrics.retrySkipped()
		return
	}
	lease := a.h.lease
	holds := a.h.holds
	deadline := time.Now().Add(lease)
	holds.Add(lease) // while its request still holds one
	go func() {
		defer func() { <-background }()
		defer holds.Done()
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
