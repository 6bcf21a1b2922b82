package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// ServeHTTP implements caddyhttp.MiddlewareHandler: it reads the key and
// the request's scope, claims the key, and hands the request to what the
// store's answer calls for. The key is validated before anything touches
// the store.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	var values []string
	if !h.key.fromBody() {
		values = h.key.values(r, nil)
	}
	if h.forwardKeyField != "" {
		// Only the handler sets it (forwardKey); read after the key, which
		// it may name.
		delete(r.Header, h.forwardKeyField)
	}
	if !slices.Contains(h.Methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.key.fromBody() {
		return h.serveBodyKey(w, r, next, repl)
	}
	return h.serveKey(w, r, next, repl, values, nil, false)
}

// serveBodyKey reads the body first, for the key it holds.
func (h *Handler) serveBodyKey(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer) error {
	body, tooLarge, err := readBody(r, h.MaxRequestBody)
	switch {
	case err != nil:
		return caddyhttp.Error(http.StatusBadRequest, err)
	case tooLarge:
		a := &attempt{h: h, w: w, r: r, repl: repl, next: next}
		return a.refuse(problemTooLarge)
	}
	return h.serveKey(w, r, next, repl, h.key.values(r, body), body, true)
}

// serveKey checks the key's values and the scope, and claims the key;
// body is the request's buffered body, if read for the key (bodyRead).
func (h *Handler) serveKey(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, values []string, body []byte, bodyRead bool) error {
	if len(values) == 0 && !h.Required {
		h.metrics.publish(repl, resultBypass)
		return next.ServeHTTP(w, r)
	}
	a := &attempt{h: h, w: w, r: r, repl: repl, next: next, body: body, bodyRead: bodyRead}
	switch {
	case len(values) == 0:
		return a.refuse(problemMissingKey)
	case len(values) > 1:
		return a.refuse(problemRepeatedKey)
	}
	clientKey, ok := store.ParseClientKey(values[0])
	if !ok || len(clientKey) < h.MinKeyLength {
		return a.refuse(problemInvalidKey)
	}
	scope, ok := h.scope.of(repl)
	if !ok {
		return a.refuse(problemMissingScope)
	}
	a.key = store.NewKey(scope, clientKey)
	return a.claimKey()
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
	case errors.Is(err, errClaimInFlight) && h.MaxWait > 0:
		return a.wait()
	case errors.Is(err, errClaimInFlight):
		return a.refuse(problemOutstanding)
	case err != nil:
		return a.storeFailed(err)
	case rec == nil:
		return a.run()
	case rec.State == store.InProgress && h.MaxWait > 0 && rec.BoundTo(&a.claim):
		return a.wait()
	default:
		return a.replay(rec)
	}
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
	withdrawals.land(ctx, a.key)
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

// Interface guard
var _ caddyhttp.MiddlewareHandler = (*Handler)(nil)
