package idempotency

import (
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// scope is the scope option: the template that names a request's caller,
// whose records no other caller shares.
type scope struct {
	template string
	require  bool // require_scope
	logger   *zap.Logger
	// emptySeen is set once a scope expanded empty, which is logged once.
	emptySeen atomic.Bool
}

func newScope(template string, require bool, logger *zap.Logger) *scope {
	return &scope{template: template, require: require, logger: logger}
}

// of expands the scope for the request of repl. ok is false when the scope
// is empty and require_scope refuses it. An empty scope is one record
// space shared by every such caller (the default behind forward_auth,
// which sets no {http.auth.user.id}), so the first one is logged.
func (s *scope) of(repl *caddy.Replacer) (scope string, ok bool) {
	scope = repl.ReplaceAll(s.template, "")
	if scope != "" || s.require {
		return scope, scope != ""
	}
	if !s.emptySeen.Load() && s.emptySeen.CompareAndSwap(false, true) {
		s.logger.Warn("scope expanded to the empty string: such requests share one scope (forward_auth sets no {http.auth.user.id}); set scope to an identity the route sets, and require_scope; logged once",
			zap.String("scope", s.template))
	}
	return "", true
}
