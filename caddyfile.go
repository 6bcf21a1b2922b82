package idempotency

import (
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// Inside authentication and compression, so the user is known and the
	// stored response is what the handlers produced, uncompressed; outside
	// every handler that produces a response (handle, respond,
	// reverse_proxy, ...), so that it guards them.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.After, "encode")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	idempotency [<matcher>] {
//		key_header        <name>
//		methods           <METHOD...>
//		required
//		scope             <template>
//		endpoint          <template...>
//		ttl               <duration>
//		lock_timeout      <duration>
//		max_request_body  <size>
//		max_response_body <size>
//		on_store_error    fail_closed | fail_open
//		on_conflict       reject | wait <max_duration>
//		replay_header     <name>
//		disable_metrics
//		store             <module> [{ ... }]
//	}
//
// Every option may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.Errf("unexpected argument '%s': options go in a block", d.Val())
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("%s already specified", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "key_header":
			h.KeyHeader, err = cfarg.One(d, opt)
		case "replay_header":
			h.ReplayHeader, err = cfarg.One(d, opt)
		case "scope":
			h.Scope, err = cfarg.One(d, opt)
		case "endpoint":
			// The template's parts may be written as separate tokens:
			// endpoint {method} {path} is "{method} {path}".
			parts := d.RemainingArgs()
			if len(parts) == 0 {
				return d.Errf("endpoint: expected a template")
			}
			h.Endpoint = strings.Join(parts, " ")
		case "methods":
			h.Methods = d.RemainingArgs()
			if len(h.Methods) == 0 {
				return d.Errf("methods: want at least one method")
			}
		case "disable_metrics":
			if d.NextArg() {
				return d.Errf("disable_metrics takes no argument, got '%s'", d.Val())
			}
			h.DisableMetrics = true
		case "required":
			if d.NextArg() {
				return d.Errf("required takes no argument, got '%s'", d.Val())
			}
			h.Required = true
		case "ttl":
			h.TTL, err = cfarg.Duration(d, opt, true)
		case "lock_timeout":
			h.LockTimeout, err = cfarg.Duration(d, opt, true)
		case "max_request_body":
			h.MaxRequestBody, err = cfarg.Size(d, opt)
		case "max_response_body":
			h.MaxResponseBody, err = cfarg.Size(d, opt)
		case "on_store_error":
			h.OnStoreError, err = cfarg.One(d, opt)
			if err == nil && h.OnStoreError != failClosed && h.OnStoreError != failOpen {
				return d.Errf("on_store_error: want fail_closed or fail_open, got '%s'", h.OnStoreError)
			}
		case "on_conflict":
			err = h.unmarshalOnConflict(d)
		case "store":
			err = h.unmarshalStore(d)
		default:
			return d.Errf("unrecognized subdirective '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalStore loads the store module named by the next token and lets it
// parse its own block, the way reverse_proxy loads its transport, and
// checks, as reverse_proxy does, that the module is what it is used as.
func (h *Handler) unmarshalStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("store: want a store name (memory, redis, ...)")
	}
	name := d.Val()
	modID := "http.idempotency.stores." + name
	unm, err := caddyfile.UnmarshalModule(d, modID)
	if err != nil {
		return err
	}
	if _, ok := unm.(store.Store); !ok {
		return d.Errf("store: module %s (%T) is not an idempotency store", modID, unm)
	}
	h.StoreRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
	return nil
}

func (h *Handler) unmarshalOnConflict(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("on_conflict: want reject or wait <max_duration>")
	}
	switch h.OnConflict = d.Val(); h.OnConflict {
	case conflictReject:
		if d.NextArg() {
			return d.Errf("on_conflict reject takes no duration, got '%s'", d.Val())
		}
	case conflictWait:
		dur, err := cfarg.Duration(d, "on_conflict wait", true)
		if err != nil {
			return err
		}
		h.MaxWait = dur
	default:
		return d.Errf("on_conflict: want reject or wait, got '%s'", h.OnConflict)
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
