// Package idempotency is a Caddy HTTP handler that makes write endpoints
// safe to retry with the Idempotency-Key header: the first request with a
// key runs once, its retries get the stored response, a concurrent
// duplicate is refused, and a key reused for another request is rejected.
package idempotency

import (
	"encoding/json"
	"fmt"
	"net/textproto"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	_ "github.com/caddy-idempotency/caddy-idempotency/admin" // admin.api.idempotency and the caddy idempotency command
	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	_ "github.com/caddy-idempotency/caddy-idempotency/store/file"
	_ "github.com/caddy-idempotency/caddy-idempotency/store/memory" // the default store
	_ "github.com/caddy-idempotency/caddy-idempotency/store/postgres"
	_ "github.com/caddy-idempotency/caddy-idempotency/store/redis"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// Inside authentication and compression, so the user is known and the
	// stored response is what the handlers produced, uncompressed; outside
	// every handler that produces a response (handle, respond,
	// reverse_proxy, ...), so that it guards them.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.After, "encode")
}

// Handler implements the Idempotency-Key protocol in front of the handlers
// that follow it in the route (typically reverse_proxy).
type Handler struct {
	// Options are the directive's options, at the top level of the
	// handler's JSON object.
	app.Options

	// The store as the requests use it: sealed, observed.
	store       store.Store
	notifier    store.Notifier // the store, if it wakes waiters across instances
	holds       *store.Holds   // the store's, which keep it open for our requests
	logger      *zap.Logger
	lease       time.Duration // LockTimeout
	expiryField string        // canonical ExpiryHeader; empty when off
	ttl         time.Duration // TTL
	key         keySource     // where the key is read
	// forwardKeyField is the canonical form of ForwardKey; empty when off.
	forwardKeyField string
	scope           *scope
	payload         fingerprint.Payload
	problems        problems
	metrics         *metrics         // nil when disabled
	keys            *sealing.Keyring // nil without encryption_keys
	leases          *leases
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from the idempotency directive
// (app.Options.UnmarshalCaddyfile gives its syntax).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return h.Options.UnmarshalCaddyfile(d)
}

// Provision takes the idempotency app's defaults, sets the rest, compiles
// what the options need and loads the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	global, err := app.Configured(ctx)
	if err != nil {
		return fmt.Errorf("reading the idempotency defaults: %w", err)
	}
	var s store.Registration
	if global != nil {
		h.Inherit(&global.Options)
		if h.StoreRaw == nil {
			s = global.Shared()
		}
	}
	h.SetDefaults()
	h.lease, h.ttl = time.Duration(h.LockTimeout), time.Duration(h.TTL)
	if h.key, err = newKeySource(textproto.CanonicalMIMEHeaderKey(h.KeyHeader), h.KeyFrom); err != nil {
		return err
	}
	h.ReplayHeader = textproto.CanonicalMIMEHeaderKey(h.ReplayHeader)
	if h.ExpiryHeader != "" {
		h.expiryField = textproto.CanonicalMIMEHeaderKey(h.ExpiryHeader)
	}
	if h.ForwardKey != "" {
		h.forwardKeyField = textproto.CanonicalMIMEHeaderKey(h.ForwardKey)
	}
	h.scope = newScope(h.Scope, h.RequireScope, h.logger)
	h.problems = newProblems(h.ProblemBase, &h.key, h.MinKeyLength, h.MaxRequestBody)
	h.problems[problemMissingScope].challenge = []string{h.ScopeChallenge}
	if h.payload, err = fingerprint.NewPayload(h.Fingerprint, h.FingerprintIgnore, h.FingerprintOnly, h.FingerprintHeaders); err != nil {
		return err
	}
	if h.keys, err = sealing.NewKeyring(h.EncryptionKeys); err != nil {
		return err
	}
	if h.keys != nil {
		h.logger.Info("sealing stored responses", zap.Strings("key_ids", h.keys.IDs()))
	}
	if !h.DisableMetrics {
		if h.metrics, err = newMetrics(ctx.GetMetricsRegistry()); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}

	if s.Store == nil {
		if h.StoreRaw == nil {
			h.StoreRaw = json.RawMessage(`{"module":"memory"}`)
			h.logger.Warn("no store configured: using the memory store, which is not shared across instances and forgets every key when Caddy stops; configure 'store redis' to run several instances")
		}
		if s, err = app.LoadStore(ctx, h, "idempotency store"); err != nil {
			return err
		}
	}
	// Beside the body, a record holds its head, the bounded endpoint and
	// the headers: recordHeadroom is room for common ones.
	const recordHeadroom = 16 << 10
	if l, ok := s.Store.(store.RecordLimit); ok && h.MaxResponseBody+recordHeadroom > l.MaxRecordBytes() {
		return fmt.Errorf("store %q keeps records of at most %d bytes, as its max_bytes sets: too few for a response of max_response_body (%d bytes) with its headers; raise max_bytes or lower max_response_body",
			s.Name, l.MaxRecordBytes(), h.MaxResponseBody)
	}
	h.notifier, _ = s.Store.(store.Notifier)
	h.holds = store.HoldsOf(s.Store)
	// Sealing is innermost, with or without keys, so that a sealed record
	// is never replayed as it is stored; the observer times and traces
	// the store calls.
	h.store = observe(&sealing.Store{Store: s.Store, Keys: h.keys, AcceptUnsealed: h.AcceptUnsealed}, s, !h.DisableMetrics)
	h.leases = newLeases(h.store, h.lease, h.metrics, h.logger)
	return nil
}

// Validate checks the configuration without I/O.
func (h *Handler) Validate() error { return h.Check() }

// Interface guards
var (
	_ caddy.Provisioner     = (*Handler)(nil)
	_ caddy.Validator       = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
