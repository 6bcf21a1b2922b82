package idempotency

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// scopeOf expands the scope template for r. ok is false when the scope is
// empty and require_scope refuses it. An empty scope is one record space
// shared by every such caller (the default behind forward_auth, which
// sets no {http.auth.user.id}), so the first one is logged.
func (h *Handler) scopeOf(repl *caddy.Replacer) (scope string, ok bool) {
	if h.scopeVariable != "" {
		scope, _ = repl.GetString(h.scopeVariable)
	} else {
		scope = repl.ReplaceAll(h.Scope, "")
	}
	if scope != "" || h.RequireScope {
		return scope, scope != ""
	}
	if !h.emptyScopeSeen.Load() && h.emptyScopeSeen.CompareAndSwap(false, true) {
		h.logger.Warn("scope expanded to the empty string: such requests share one scope (forward_auth sets no {http.auth.user.id}); set scope to an identity the route sets, and require_scope; logged once",
			zap.String("scope", h.Scope))
	}
	return "", true
}

// soleVariable returns the variable of a template that is one placeholder
// and nothing else, such as the default scope, {http.auth.user.id}: its
// expansion is the variable's value, which Get reads without ReplaceAll's
// scan and string builder. Templates with escapes, nesting or anything
// around the placeholder give "".
func soleVariable(template string) string {
	if len(template) < 3 || template[0] != '{' || template[len(template)-1] != '}' {
		return ""
	}
	name := template[1 : len(template)-1]
	if strings.ContainsAny(name, "{}\\") {
		return ""
	}
	return name
}

// dropForwardedKey removes a client's copy of the forward_key header from
// every request the handler sees: only the handler may set it.
func (h *Handler) dropForwardedKey(r *http.Request) {
	if h.forwardKeyField != "" {
		delete(r.Header, h.forwardKeyField)
	}
}

// forwardKey hands the upstream the scoped key hash of a protected
// request, per forward_key.
func (h *Handler) forwardKey(r *http.Request, key store.Key) {
	if h.forwardKeyField != "" {
		r.Header[h.forwardKeyField] = []string{key.String()}
	}
}
