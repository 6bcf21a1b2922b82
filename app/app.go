// Package app is the global idempotency option: the idempotency app module,
// which holds every handler's defaults and the store they share, and the
// options themselves (Options), their defaults, checks and Caddyfile syntax.
package app

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
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
	// disable_metrics, store_server_errors, accept_unsealed) can only be
	// turned on by either.
	Options

	shared store.Registration
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision compiles the defaults' fingerprint_ignore pointers, to report
// a bad one, and loads the shared store, if the defaults name one.
func (a *App) Provision(ctx caddy.Context) error {
	if _, err := fingerprint.NewPayload(a.Fingerprint, a.FingerprintIgnore, a.FingerprintOnly, nil); err != nil {
		return fmt.Errorf("idempotency defaults: %w", err)
	}
	if a.StoreRaw == nil {
		return nil
	}
	var err error
	if a.shared, err = LoadStore(ctx, a, "the shared idempotency store"); err != nil {
		return err
	}
	a.StoreRaw = nil // loaded once, here; handlers use a.shared
	return nil
}

// Shared is the store that the defaults name, which the routes that name
// none share; empty when the defaults name none.
func (a *App) Shared() store.Registration { return a.shared }

// Validate checks the defaults that are set.
func (a *App) Validate() error {
	if err := a.Check(); err != nil {
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
	return a.Options.UnmarshalCaddyfile(d)
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

// Configured returns the config's idempotency app, nil if it has none.
func Configured(ctx caddy.Context) (*App, error) {
	val, err := ctx.AppIfConfigured("idempotency")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return val.(*App), nil
}

// LoadStore loads the store module that the StoreRaw field of holder (a
// *Handler or an *App) configures, with the name it is registered under
// (its module's name if it does not register), which labels its metrics
// and spans. what names the store in errors.
func LoadStore(ctx caddy.Context, holder any, what string) (store.Registration, error) {
	mod, err := ctx.LoadModule(holder, "StoreRaw")
	if err != nil {
		return store.Registration{}, fmt.Errorf("loading %s: %w", what, err)
	}
	s, ok := mod.(store.Store)
	if !ok {
		// a JSON config can name any module; a Caddyfile's is checked as
		// it is parsed (unmarshalStore)
		return store.Registration{}, fmt.Errorf("module %T is not an idempotency store", mod)
	}
	if reg, ok := store.RegistrationOf(s); ok {
		return reg, nil
	}
	name := mod.(caddy.Module).CaddyModule().ID.Name()
	return store.Registration{Name: name, Module: name, Store: s}, nil
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Validator   = (*App)(nil)

	_ caddyfile.Unmarshaler = (*App)(nil)
)
