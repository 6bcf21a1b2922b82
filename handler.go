package idempotency

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// statusClientClosed is the status Caddy's reverse_proxy writes when the
// request's context ends before the upstream answers: here, when the work
// was cancelled one lease after its client left.
const statusClientClosed = 499

var trueValue = []string{"true"}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	values := r.Header[h.keyField]
	h.dropForwardedKey(r) // after reading the key: forward_key may name its header
	if !h.covers(r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	// The key is validated before anything touches the store.
	switch {
	case len(values) == 0 && h.Required:
		return h.refuse(w, r, repl, resultInvalid, h.problems.missing)
	case len(values) == 0:
		h.setResult(repl, resultBypass)
		return next.ServeHTTP(w, r)
	case len(values) > 1:
		return h.refuse(w, r, repl, resultInvalid, h.problems.repeated)
	}
	clientKey, ok := parseKey(values[0])
	if !ok {
		return h.refuse(w, r, repl, resultInvalid, h.problems.invalid)
	}
	scope, ok := h.scopeOf(repl)
	if !ok {
		return h.refuse(w, r, repl, resultInvalid, h.problems.missingScope)
	}
	return h.serveKeyed(w, r, repl, next, store.NewKey(scope, clientKey))
}

// serveKeyed runs, replays or refuses a request with a valid key. (Apart
// from ServeHTTP's many returns, so that its defers stay cheap:
// open-coded.)
func (h *Handler) serveKeyed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, key store.Key) error {
	// From here the request uses the store, which a reload that replaces
	// it must leave open until the request and its background work are
	// done (store.Holds).
	h.holds.Take(time.Duration(h.LockTimeout))
	defer h.holds.Give()

	body, tooLarge, err := h.readBody(r)
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if tooLarge {
		return h.refuse(w, r, repl, resultTooLarge, h.problems.tooLarge)
	}
	defer body.release()

	repl.Set("http.idempotency.key", key) // hex-encoded only if a log asks
	h.forwardKey(r, key)
	claim := &store.Claim{
		Token:       newToken(),
		Endpoint:    h.endpoint(r, repl),
		Fingerprint: h.fingerprintOf(r, body.buffer()),
		Lease:       time.Duration(h.LockTimeout),
	}
	rec, err := h.store.Acquire(r.Context(), key, claim)
	switch {
	case err != nil:
		return h.acquireFailed(w, r, repl, next, key, claim.Token, err)
	case rec != nil && rec.State == store.InProgress && h.MaxWait > 0 && boundTo(rec, claim):
		return h.wait(w, r, repl, next, key, claim)
	case rec != nil:
		return h.answerFromRecord(w, r, repl, rec, claim)
	}
	h.setResult(repl, resultNew)
	h.claimed(key, claim)
	return h.execute(w, r, repl, next, key, claim)
}

// setResult publishes the request's outcome to the access log placeholder
// and the metrics.
func (h *Handler) setResult(repl *caddy.Replacer, r result) {
	repl.Set("http.idempotency.result", results[r].value)
	h.metrics.result(r)
}

// claimed notes a claim that took over a dead owner's: its request may
// have run, or be running, on the instance that died.
func (h *Handler) claimed(key store.Key, c *store.Claim) {
	if c.TookOver {
		h.metrics.tookOver()
		h.logger.Info("took over the claim of a request whose lease passed; running it again",
			zap.String("key_hash", key.String()))
	}
}

func (h *Handler) covers(method string) bool {
	for _, m := range h.Methods {
		if m == method {
			return true
		}
	}
	return false
}

func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, res result, p *problem) error {
	h.setResult(repl, res)
	return p.answer(w, r, repl)
}

// answerFromRecord answers a request whose key already has a live record.
func (h *Handler) answerFromRecord(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, rec *store.Record, c *store.Claim) error {
	switch {
	case rec.Endpoint != c.Endpoint:
		return h.refuse(w, r, repl, resultMismatch, h.problems.otherEndpoint)
	case rec.Fingerprint != c.Fingerprint:
		return h.refuse(w, r, repl, resultMismatch, h.problems.otherPayload)
	case rec.State == store.InProgress:
		return h.refuse(w, r, repl, resultConflict, h.problems.outstanding)
	case rec.OutcomeUnknown:
		return h.refuse(w, r, repl, resultUnknown, h.problems.outcomeUnknown)
	case rec.Truncated:
		return h.refuse(w, r, repl, resultReplay, h.problems.unreplayable)
	}
	// A coding the retry does not accept is undone (codings.go).
	body, decoded := rec.Body, false
	if codings := rec.Header["Content-Encoding"]; len(codings) > 0 && !acceptsCodings(r.Header["Accept-Encoding"], codings) {
		var ok bool
		if body, ok = decodeBody(codings, body); !ok {
			return h.refuse(w, r, repl, resultReplay, h.problems.notAcceptable)
		}
		decoded = true
	}
	h.setResult(repl, resultReplay)
	hdr := w.Header()
	trailers := replayHeader(hdr, rec.Header, decoded)
	hdr[h.ReplayHeader] = trueValue
	if trailers != nil {
		// declared, and without a length, so that HTTP/1.1 sends it
		// chunked, with room for the trailers
		hdr["Trailer"] = []string{strings.Join(trailers, ", ")}
	} else {
		hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	w.WriteHeader(rec.Status)
	if _, err := w.Write(body); err != nil {
		// the client left during a replay; it can retry again
		panic(http.ErrAbortHandler)
	}
	if trailers != nil {
		replayTrailers(w.Header(), rec.Header)
	}
	return nil
}

// acquireFailed answers a request whose claim the store could not take,
// per on_store_error, and withdraws the claim in case it lands late. A
// client that left while its claim waited (for a pooled connection, a
// slow reply) ends the call with its context: that is no store failure,
// and nobody is left to answer or to run the request for.
func (h *Handler) acquireFailed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, key store.Key, tok store.Token, err error) error {
	if u, ok := errors.AsType[*unreadableRecord](err); ok {
		return h.refuseUnreadable(w, r, repl, key, u) // nothing was claimed
	}
	h.withdraw(detached(r.Context()), key, tok)
	if r.Context().Err() != nil {
		h.setResult(repl, resultGone)
		w.WriteHeader(statusClientClosed) // for the access log, as reverse_proxy does
		return nil
	}
	h.setResult(repl, resultError)
	if h.OnStoreError == failOpen {
		h.logger.Warn("idempotency store unavailable; passing the request through unprotected (fail_open)",
			zap.String("key_hash", key.String()), zap.Error(err))
		handOn(r)
		return next.ServeHTTP(w, r)
	}
	h.logger.Error("idempotency store unavailable; refusing the request (fail_closed)",
		zap.String("key_hash", key.String()), zap.Error(err))
	return h.problems.storeUnavailable.answer(w, r, repl)
}

// execute runs the request as the owner of the key's claim and stores what
// it answered.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, key store.Key, c *store.Claim) (err error) {
	rw := newRecorder(w, h.MaxResponseBody)
	defer rw.free()
	h.metrics.claimHeld(1)
	defer h.metrics.claimHeld(-1)
	if h.markEarlierUpstream(repl) {
		defer unmarkEarlierUpstream(repl)
	}
	run, ctx := h.leases.start(r.Context(), key, c.Token)
	after := detached(r.Context())
	defer func() {
		if p := recover(); p != nil {
			h.leases.stop(run)
			h.finish(after, key, c, rw, repl, nil, true)
			panic(p)
		}
	}()
	handOn(r)
	err = next.ServeHTTP(rw, r.WithContext(ctx))
	if err == nil && !rw.wroteHeader && ctx.Err() != nil {
		// reverse_proxy before Caddy v2.11 returns nothing when its work is
		// cancelled; write the 499 later ones do, or it would pass for an
		// empty 200.
		rw.WriteHeader(statusClientClosed)
	}
	h.leases.stop(run) // before finishing, so a last renewal cannot race the release
	h.finish(after, key, c, rw, repl, err, false)
	return err
}

// finish ends the claim of a request that has run, as decideEnding
// (ending.go) says. ctx is detached from the client's: its response is
// being stored for its retry whether or not it stayed. Each store bounds
// its own calls.
func (h *Handler) finish(ctx context.Context, key store.Key, c *store.Claim, rw *recorder, repl *caddy.Replacer, handlerErr error, aborted bool) {
	defer store.SignalEnd(key)
	s := seen{wroteHeader: rw.wroteHeader, status: rw.status, overflow: rw.overflow,
		handlerErr: handlerErr != nil, aborted: aborted}
	if !s.wroteHeader && (s.handlerErr || s.aborted) {
		s.reached = reachedUpstream(repl, handlerErr)
	}
	end, why := h.decideEnding(s)
	switch end {
	case endStore:
		h.complete(ctx, key, c, rw.record())
	case endStoreTruncated:
		h.complete(ctx, key, c, &store.Record{Status: rw.status, Truncated: true})
	case endRelease:
		h.release(ctx, key, c.Token, why)
	case endKeepUnknown:
		h.keepUnknown(ctx, key, c, why, handlerErr)
	}
}

// complete stores rec as the outcome of c's request, and keeps trying in
// the background if the store is away.
func (h *Handler) complete(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record) {
	err := h.store.Complete(ctx, key, c, rec, time.Duration(h.TTL))
	switch {
	case errors.Is(err, store.ErrNotOwner):
		h.logger.Error("claim was lost before the response could be stored: the lease passed and another request took the key over (raise lock_timeout), or an operator purged it",
			zap.String("key_hash", key.String()))
	case err != nil:
		h.logger.Warn("storing the response failed; retrying until the lease passes",
			zap.String("key_hash", key.String()), zap.Error(err))
		h.completeLater(ctx, key, c, rec)
	}
}
