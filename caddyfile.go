package idempotency

import (
	"strconv"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
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
//		require_scope
//		forward_key       <header>
//		endpoint          <template...>
//		fingerprint       body | json | none
//		fingerprint_ignore <json-pointer...>
//		fingerprint_headers <name...>
//		ttl               <duration>
//		lock_timeout      <duration>
//		max_request_body  <size>
//		max_response_body <size>
//		on_store_error    fail_closed | fail_open
//		on_conflict       reject | wait <max_duration>
//		on_unknown_outcome release | keep
//		store_server_errors
//		release_statuses  <status...>
//		replay_header     <name>
//		disable_metrics
//		encryption_keys   <key...>
//		store             <module> [{ ... }]
//	}
//
// Every option may appear once. fingerprint_ignore requires fingerprint
// json in the same block.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	const maxBodyLimit = 1 << 40 // 1 TiB: bodies are buffered in memory, so more is a mistake
	// Made where fingerprint_ignore is, to name its line; returned at the
	// end of the block, once the mode is known.
	var ignoreWithoutJSON error
	err := cfarg.Block(d, nil, func(opt string) (err error) {
		switch opt {
		case "key_header":
			h.KeyHeader, err = cfarg.One(d, opt)
		case "replay_header":
			h.ReplayHeader, err = cfarg.One(d, opt)
		case "scope":
			h.Scope, err = cfarg.One(d, opt)
		case "require_scope":
			err = cfarg.Flag(d, opt)
			h.RequireScope = true
		case "forward_key":
			if h.ForwardKey, err = cfarg.One(d, opt); err == nil && !validToken(h.ForwardKey) {
				err = d.Errf("%s: invalid header name '%s'", opt, h.ForwardKey)
			}
		case "endpoint":
			// The template's parts may be written as separate tokens:
			// endpoint {method} {path} is "{method} {path}".
			var parts []string
			parts, err = cfarg.List(d, opt)
			h.Endpoint = strings.Join(parts, " ")
		case "fingerprint":
			h.Fingerprint, err = cfarg.OneOf(d, opt, fingerprintBody, fingerprintJSON, fingerprintNone)
		case "fingerprint_ignore":
			if h.FingerprintIgnore, err = cfarg.List(d, opt); err != nil {
				return err
			}
			if _, err := canonjson.Compile(h.FingerprintIgnore); err != nil {
				return d.Err(err.Error())
			}
			ignoreWithoutJSON = d.Errf("%s: applies only with 'fingerprint json' in the same block", opt)
		case "fingerprint_headers":
			if h.FingerprintHeaders, err = cfarg.List(d, opt); err != nil {
				return err
			}
			for _, name := range h.FingerprintHeaders {
				if !validToken(name) {
					return d.Errf("%s: invalid header name '%s'", opt, name)
				}
			}
		case "methods":
			h.Methods, err = cfarg.List(d, opt)
		case "disable_metrics":
			err = cfarg.Flag(d, opt)
			h.DisableMetrics = true
		case "required":
			err = cfarg.Flag(d, opt)
			h.Required = true
		case "ttl":
			h.TTL, err = cfarg.Duration(d, opt, true)
		case "lock_timeout":
			h.LockTimeout, err = cfarg.Duration(d, opt, true)
		case "max_request_body":
			h.MaxRequestBody, err = cfarg.Size(d, opt, maxBodyLimit)
		case "max_response_body":
			h.MaxResponseBody, err = cfarg.Size(d, opt, maxBodyLimit)
		case "on_store_error":
			h.OnStoreError, err = cfarg.OneOf(d, opt, failClosed, failOpen)
		case "on_conflict":
			err = h.unmarshalOnConflict(d)
		case "on_unknown_outcome":
			h.OnUnknownOutcome, err = cfarg.OneOf(d, opt, unknownRelease, unknownKeep)
		case "store_server_errors":
			err = cfarg.Flag(d, opt)
			h.StoreServerErrors = true
		case "release_statuses":
			h.ReleaseStatuses, err = unmarshalStatuses(d, opt)
		case "encryption_keys":
			// checked at provision, once placeholders are resolved
			h.EncryptionKeys, err = cfarg.List(d, opt)
		case "store":
			err = h.unmarshalStore(d)
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
	if err == nil && ignoreWithoutJSON != nil && h.Fingerprint != fingerprintJSON {
		return ignoreWithoutJSON
	}
	return err
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
		return cfarg.Flag(d, "on_conflict reject")
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

// unmarshalStatuses reads opt's arguments as 4xx or 5xx statuses.
func unmarshalStatuses(d *caddyfile.Dispenser, opt string) ([]int, error) {
	args, err := cfarg.List(d, opt)
	if err != nil {
		return nil, err
	}
	statuses := make([]int, len(args))
	for i, arg := range args {
		status, err := strconv.Atoi(arg)
		if err != nil || status < 400 || status > 599 {
			return nil, d.Errf("%s: want 4xx or 5xx statuses, got '%s'", opt, arg)
		}
		statuses[i] = status
	}
	return statuses, nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
