package idempotency

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddy.RegisterModule(App{})
	httpcaddyfile.RegisterGlobalOption("idempotency", parseGlobalOption)
}

// App holds the defaults of every idempotency handler in the config, and
// the store they share. Set it with the Caddyfile's global option
//
//	{
//		idempotency {
//			store redis { ... }
//			ttl 48h
//			...every option of the directive...
//		}
//	}
//
// Routes then say only what differs. Each route keeps its own endpoint
// binding; the routes that set no store of their own share the app's store
// instance, and so one connection pool.
type App struct {
	// Options are the defaults, with the directive's option names. A
	// route's own value wins; flags (required, require_scope,
	// disable_metrics, store_server_errors) can only be turned on by either.
	Options

	shared     store.Store
	sharedName string // the store's name, for metrics labels
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision loads the shared store, if the defaults name one.
func (a *App) Provision(ctx caddy.Context) error {
	if a.StoreRaw == nil {
		return nil
	}
	var err error
	if a.shared, a.sharedName, err = loadStore(ctx, a, "the shared idempotency store"); err != nil {
		return err
	}
	a.StoreRaw = nil // loaded once, here; handlers use a.shared
	return nil
}

// Validate checks the defaults as a handler would see them.
func (a *App) Validate() error {
	h := Handler{Options: a.Options}
	h.Methods = append([]string(nil), a.Methods...)
	h.setDefaults()
	if err := h.Validate(); err != nil {
		return fmt.Errorf("idempotency defaults: %w", err)
	}
	return nil
}

// Start implements caddy.App; the app only holds configuration.
func (*App) Start() error { return nil }

// Stop implements caddy.App.
func (*App) Stop() error { return nil }

// UnmarshalCaddyfile reads the global option's block, which holds the
// directive's options.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	var h Handler
	err := h.UnmarshalCaddyfile(d)
	a.Options = h.Options
	return err
}

func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	var app App
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	// Caddy expands placeholder shorthands ({host}, {header.X-Tenant}) in
	// site blocks only; the templates of the global option get the same.
	app.Scope = expandShorthands(app.Scope)
	app.Endpoint = expandShorthands(app.Endpoint)
	return httpcaddyfile.App{Name: "idempotency", Value: caddyconfig.JSON(app, nil)}, nil
}

func expandShorthands(template string) string {
	if template == "" {
		return ""
	}
	seg := caddyfile.Segment{{Text: template}}
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&seg)
	return seg[0].Text
}

// inherit fills the options this handler leaves unset from the config's
// idempotency app, if there is one. When the handler sets no store of its
// own, it returns the app's shared store, if any, with its name.
func (h *Handler) inherit(ctx caddy.Context) (shared store.Store, name string, err error) {
	val, err := ctx.AppIfConfigured("idempotency")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	app := val.(*App)
	d := &app.Options
	pick := func(own *string, def string) {
		if *own == "" {
			*own = def
		}
	}
	pick(&h.KeyHeader, d.KeyHeader)
	pick(&h.Scope, d.Scope)
	pick(&h.ForwardKey, d.ForwardKey)
	pick(&h.Endpoint, d.Endpoint)
	pick(&h.OnStoreError, d.OnStoreError)
	pick(&h.ReplayHeader, d.ReplayHeader)
	pick(&h.OnUnknownOutcome, d.OnUnknownOutcome)
	if h.OnConflict == "" {
		h.OnConflict, h.MaxWait = d.OnConflict, d.MaxWait
	}
	if len(h.Methods) == 0 {
		h.Methods = append([]string(nil), d.Methods...)
	}
	pick(&h.Fingerprint, d.Fingerprint)
	if len(h.FingerprintIgnore) == 0 && h.Fingerprint == fingerprintJSON && d.Fingerprint == fingerprintJSON {
		// the pointers go with the mode: a route with a mode of its own
		// does not take the defaults' pointers for another
		h.FingerprintIgnore = append([]string(nil), d.FingerprintIgnore...)
	}
	if len(h.ReleaseStatuses) == 0 {
		h.ReleaseStatuses = append([]int(nil), d.ReleaseStatuses...)
	}
	if len(h.FingerprintHeaders) == 0 {
		h.FingerprintHeaders = append([]string(nil), d.FingerprintHeaders...)
	}
	if len(h.EncryptionKeys) == 0 {
		h.EncryptionKeys = append([]string(nil), d.EncryptionKeys...)
	}
	if h.TTL == 0 {
		h.TTL = d.TTL
	}
	if h.LockTimeout == 0 {
		h.LockTimeout = d.LockTimeout
	}
	if h.MaxRequestBody == 0 {
		h.MaxRequestBody = d.MaxRequestBody
	}
	if h.MaxResponseBody == 0 {
		h.MaxResponseBody = d.MaxResponseBody
	}
	h.Required = h.Required || d.Required
	h.RequireScope = h.RequireScope || d.RequireScope
	h.DisableMetrics = h.DisableMetrics || d.DisableMetrics
	h.StoreServerErrors = h.StoreServerErrors || d.StoreServerErrors
	if h.StoreRaw == nil && app.shared != nil {
		return app.shared, app.sharedName, nil
	}
	return nil, "", nil
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Validator   = (*App)(nil)

	_ caddyfile.Unmarshaler = (*App)(nil)
)
