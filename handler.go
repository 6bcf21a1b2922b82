package idempotency

import (
	"net/http"
	"slices"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

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

// Interface guard
var _ caddyhttp.MiddlewareHandler = (*Handler)(nil)
