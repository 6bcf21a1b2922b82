package app

import (
	"strconv"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile reads the options of the idempotency directive, and
// of the global option's block:
//
//	idempotency [<matcher>] {
//		key_header        <name>
//		methods           <METHOD...>
//		required
//		scope             <template>
//		key_from          header <name> | query <name> | json <pointer>
//		problem_base      <uri>
//		expiry_header     <name>
//		min_key_length    <n>
//		require_scope [<challenge>]
//		forward_key       <header>
//		endpoint          <template...>
//		fingerprint       body | json | none
//		fingerprint_ignore <json-pointer...>
//		fingerprint_only   <json-pointer...>
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
//		replay_header     <name> [always]
//		disable_metrics
//		encryption_keys   <key...>
//		accept_unsealed
//		store             <module> [{ ... }]
//	}
//
// Every option may appear once. The parser checks the syntax; what the
// values mean (header names, statuses, JSON pointers) is checked once, by
// Provision and Validate.
func (o *Options) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	const maxBodyLimit = 1 << 40 // 1 TiB: bodies are buffered in memory, so more is a mistake
	keyPlaced := false           // key_header and key_from both say where the key is: one may
	return cfarg.Block(d, nil, func(opt string) (err error) {
		switch opt {
		case "key_header", "key_from":
			if keyPlaced {
				return d.Errf("%s: the key's place is named already (key_header or key_from): use one", opt)
			}
			keyPlaced = true
		}
		switch opt {
		case "key_header":
			o.KeyHeader, err = cfarg.One(d, opt)
		case "key_from":
			err = o.unmarshalKeyFrom(d, opt)
		case "replay_header":
			args := d.RemainingArgs()
			switch {
			case len(args) == 2 && args[1] == "always":
				o.ReplayHeaderAlways = true
			case len(args) != 1:
				return d.Errf("%s: want <name> [always]", opt)
			}
			o.ReplayHeader = args[0]
		case "expiry_header":
			o.ExpiryHeader, err = cfarg.One(d, opt)
		case "problem_base":
			o.ProblemBase, err = cfarg.One(d, opt)
		case "scope":
			o.Scope, err = cfarg.One(d, opt)
		case "require_scope":
			// The rest of the line, if any, is the 401's challenge.
			o.RequireScope = true
			o.ScopeChallenge = strings.Join(d.RemainingArgs(), " ")
		case "forward_key":
			o.ForwardKey, err = cfarg.One(d, opt)
		case "endpoint":
			// The template's parts may be written as separate tokens:
			// endpoint {method} {path} is "{method} {path}".
			var parts []string
			parts, err = cfarg.List(d, opt)
			o.Endpoint = strings.Join(parts, " ")
		case "fingerprint":
			o.Fingerprint, err = cfarg.OneOf(d, opt, fingerprint.Body, fingerprint.JSON, fingerprint.None)
		case "fingerprint_ignore":
			o.FingerprintIgnore, err = cfarg.List(d, opt)
		case "fingerprint_only":
			o.FingerprintOnly, err = cfarg.List(d, opt)
		case "fingerprint_headers":
			o.FingerprintHeaders, err = cfarg.List(d, opt)
		case "methods":
			o.Methods, err = cfarg.List(d, opt)
		case "disable_metrics":
			err = cfarg.Flag(d, opt)
			o.DisableMetrics = true
		case "required":
			err = cfarg.Flag(d, opt)
			o.Required = true
		case "ttl":
			o.TTL, err = cfarg.Duration(d, opt, true)
		case "lock_timeout":
			o.LockTimeout, err = cfarg.Duration(d, opt, true)
		case "min_key_length":
			o.MinKeyLength, err = cfarg.Count(d, opt, true)
		case "max_request_body":
			o.MaxRequestBody, err = cfarg.Size(d, opt, maxBodyLimit)
		case "max_response_body":
			o.MaxResponseBody, err = cfarg.Size(d, opt, maxBodyLimit)
		case "on_store_error":
			o.OnStoreError, err = cfarg.OneOf(d, opt, FailClosed, FailOpen)
		case "on_conflict":
			err = o.unmarshalOnConflict(d)
		case "on_unknown_outcome":
			o.OnUnknownOutcome, err = cfarg.OneOf(d, opt, UnknownRelease, UnknownKeep)
		case "store_server_errors":
			err = cfarg.Flag(d, opt)
			o.StoreServerErrors = true
		case "release_statuses":
			o.ReleaseStatuses, err = unmarshalStatuses(d, opt)
		case "encryption_keys":
			// checked at provision, once placeholders are resolved
			o.EncryptionKeys, err = cfarg.List(d, opt)
		case "accept_unsealed":
			err = cfarg.Flag(d, opt)
			o.AcceptUnsealed = true
		case "store":
			err = o.unmarshalStore(d)
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
}

// unmarshalStore loads the store module named by the next token and lets it
// parse its own block, the way reverse_proxy loads its transport, and
// checks, as reverse_proxy does, that the module is what it is used as.
func (o *Options) unmarshalStore(d *caddyfile.Dispenser) error {
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
	o.StoreRaw = caddyconfig.JSONModuleObject(unm, "module", name, nil)
	return nil
}

func (o *Options) unmarshalOnConflict(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("on_conflict: want reject or wait <max_duration>")
	}
	switch o.OnConflict = d.Val(); o.OnConflict {
	case ConflictReject:
		return cfarg.Flag(d, "on_conflict reject")
	case ConflictWait:
		dur, err := cfarg.Duration(d, "on_conflict wait", true)
		if err != nil {
			return err
		}
		o.MaxWait = dur
	default:
		return d.Errf("on_conflict: want reject or wait, got '%s'", o.OnConflict)
	}
	return nil
}

// unmarshalStatuses reads opt's arguments as statuses.
func unmarshalStatuses(d *caddyfile.Dispenser, opt string) ([]int, error) {
	args, err := cfarg.List(d, opt)
	if err != nil {
		return nil, err
	}
	statuses := make([]int, len(args))
	for i, arg := range args {
		status, err := strconv.Atoi(arg)
		if err != nil {
			return nil, d.Errf("%s: want statuses, got '%s'", opt, arg)
		}
		statuses[i] = status
	}
	return statuses, nil
}

// unmarshalKeyFrom reads key_from header|query|json <name or pointer>;
// key_from header is key_header.
func (o *Options) unmarshalKeyFrom(d *caddyfile.Dispenser, opt string) error {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return d.Errf("%s: want header <name>, query <name> or json <pointer>", opt)
	}
	switch args[0] {
	case "header":
		o.KeyHeader = args[1]
	case "query":
		o.KeyFrom = &KeyFrom{Query: args[1]}
	case "json":
		o.KeyFrom = &KeyFrom{JSON: args[1]}
	default:
		return d.Errf("%s: unknown source '%s': want header, query or json", opt, args[0])
	}
	return nil
}
