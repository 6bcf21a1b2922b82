package app

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Defaults, as documented in the README.
const (
	defaultKeyHeader    = "Idempotency-Key"
	DefaultScope        = "{http.auth.user.id}"
	defaultTTL          = 24 * time.Hour
	defaultLockTimeout  = 30 * time.Second
	DefaultProblemBase  = "https://github.com/caddy-idempotency/caddy-idempotency"
	defaultMaxBody      = 1 << 20
	defaultReplayHeader = "Idempotent-Replayed"
	FailClosed          = "fail_closed"
	FailOpen            = "fail_open"
	ConflictReject      = "reject"
	ConflictWait        = "wait"
	UnknownRelease      = "release"
	UnknownKeep         = "keep"
)

var defaultMethods = []string{http.MethodPost, http.MethodPatch}

// maxDuration bounds ttl, lock_timeout and max_wait: a record's end, now
// plus both, must stay within what a time in nanoseconds holds (until 2262).
const maxDuration = 100 * 365 * 24 * time.Hour

// defaultReleaseStatuses answer a request that was not carried out: the
// caller must authenticate (401, 407), the server gave up waiting for the
// request (408), would not risk a replay of early data (425), or limits
// the caller's rate (429).
var defaultReleaseStatuses = []int{
	http.StatusUnauthorized, http.StatusProxyAuthRequired, http.StatusRequestTimeout,
	http.StatusTooEarly, http.StatusTooManyRequests,
}

// KeyFrom says where a request's key is read, when not from a header
// (key_header): from a query parameter, which stays in the query the
// upstream sees, or from a string member of a JSON body, named by an RFC
// 6901 pointer, as Square's API sends idempotency_key and a webhook
// receiver dedupes on an event's id. Exactly one is set.
type KeyFrom struct {
	// Query is the name of the query parameter that carries the key.
	Query string `json:"query,omitempty"`
	// JSON is the RFC 6901 pointer to the string member of the JSON body
	// that carries the key. A body that is not JSON, or lacks the member,
	// is a request without a key; a body over max_request_body gets 413.
	JSON string `json:"json,omitempty"`
}

// Options configure a handler: they are the idempotency directive's
// options, and the idempotency app holds them as every handler's defaults.
type Options struct {
	// KeyHeader is the request header that carries the key.
	// Default: Idempotency-Key.
	KeyHeader string `json:"key_header,omitempty"`

	// KeyFrom reads the key from a query parameter or a JSON body instead
	// of KeyHeader. The Caddyfile's key_from header <name> is key_header.
	KeyFrom *KeyFrom `json:"key_from,omitempty"`

	// Methods are the request methods made idempotent; requests with other
	// methods pass through untouched, even if they carry a key.
	// Default: POST, PATCH.
	Methods []string `json:"methods,omitempty"`

	// Required refuses requests without a key with 400. Without it,
	// requests without a key pass through unprotected.
	Required bool `json:"required,omitempty"`

	// Scope is a template of Caddy placeholders, expanded per request and
	// combined with the key, so that clients with the same key never share
	// a record. Default: {http.auth.user.id} (the authenticated user; empty,
	// hence one shared scope, when the route has no authentication).
	Scope string `json:"scope,omitempty"`

	// RequireScope refuses with 401 a request whose scope expands to the
	// empty string, instead of letting it share the one empty scope with
	// every other such request: behind forward_auth, or a header that a
	// request lacks. Without it, the first empty scope is logged.
	RequireScope bool `json:"require_scope,omitempty"`

	// ScopeChallenge is the WWW-Authenticate challenge of require_scope's
	// 401, which RFC 9110 requires of every 401: the scheme the route's
	// authentication uses, such as Basic realm="payments". Default: Bearer.
	ScopeChallenge string `json:"scope_challenge,omitempty"`

	// ProblemBase is the URI of the idempotency documentation the
	// problems' type points into: a problem's type is ProblemBase#anchor
	// (#key-reused, #outstanding, ...), so that an API team sends its
	// clients to its own error docs (the IETF draft asks that the error link
	// to them). An absolute URI without a fragment. Default:
	// https://github.com/caddy-idempotency/caddy-idempotency (this module's
	// README).
	ProblemBase string `json:"problem_base,omitempty"`

	// ReplayHeaderAlways marks first answers too, with ReplayHeader:
	// false, so that a client tells a fresh run from a replay without
	// knowing that the header's absence means one. Caddyfile:
	// replay_header <name> always.
	ReplayHeaderAlways bool `json:"replay_header_always,omitempty"`

	// ExpiryHeader names a response header that tells, as an HTTP-date,
	// when the key's record expires: on every answer that has a record,
	// the first one (now plus ttl, when the answer is to be stored) and
	// every replay (the stored record's own expiry, not now plus ttl). Off
	// by default.
	ExpiryHeader string `json:"expiry_header,omitempty"`

	// MinKeyLength is the shortest key accepted, in characters (of the
	// key's value, without the quotes of its quoted form); a shorter one
	// gets the invalid-key 400. The IETF draft asks for keys with enough
	// entropy to be unique: a UUID has 36. From 1 to 255. Default: 1.
	MinKeyLength int `json:"min_key_length,omitempty"`

	// ForwardKey names a request header set, for the handlers that follow
	// (the upstream), to the scoped key hash ({http.idempotency.key}) on
	// every request the handler protects, so the upstream can hand it on
	// to its payment provider. A copy of it that the client sent is removed
	// from every request the handler sees, protected or passed through: a
	// client never chooses the key the upstream hands on.
	ForwardKey string `json:"forward_key,omitempty"`

	// Endpoint is a template of Caddy placeholders, expanded per request:
	// what a key is bound to besides its payload. A key reused where the
	// template expands to something else gets 422; with
	// {http.request.method} {http.request.uri.path}, keys are shared across
	// the host names of one API. Default:
	// {http.request.method} {http.request.host}{http.request.uri.path} (the
	// method, the host without its port, in lower case, and the path).
	Endpoint string `json:"endpoint,omitempty"`

	// Fingerprint says which parts of a request make the payload a key is
	// bound to: a retry with the same payload is replayed, another gets
	// 422. "body": the exact query and body bytes. "json": the body's
	// canonical JSON (member order, whitespace and spellings of one value
	// do not count; array order does) and the query as a sorted set; a body
	// that is not JSON counts as its bytes. "none": the key and endpoint
	// only; the body is not read, so max_request_body does not apply.
	// Changing the mode changes every fingerprint, so for one ttl after
	// the change a retry may get 422. Default: body.
	Fingerprint string `json:"fingerprint,omitempty"`

	// FingerprintIgnore lists the values left out of the json fingerprint,
	// such as a timestamp or a trace id that a client sets afresh on each
	// retry, as RFC 6901 JSON pointers in which the token * matches every
	// element of an array and every member of an object: /sent_at,
	// /meta/trace_id, /items/*/client_ts. Requires fingerprint json.
	FingerprintIgnore []string `json:"fingerprint_ignore,omitempty"`

	// FingerprintOnly lists the only values that make the json
	// fingerprint, as RFC 6901 pointers with * as in fingerprint_ignore:
	// /amount, /currency, /items/*/sku. The complement of
	// fingerprint_ignore (the IETF draft's "selected elements"): the
	// rest of the body may change between retries. An absent member counts
	// as absent, not as null. Requires fingerprint json; not with
	// fingerprint_ignore.
	FingerprintOnly []string `json:"fingerprint_only,omitempty"`

	// FingerprintHeaders are request headers that count in the fingerprint,
	// in every mode, such as Content-Type or X-Account-Id: the same body
	// sent with another value of one of them is another payload (422). A
	// header that is absent differs from one that is empty, and several
	// lines of one header count in their order. Names are case-insensitive.
	FingerprintHeaders []string `json:"fingerprint_headers,omitempty"`

	// TTL is how long a completed response is replayed, at most 100 years.
	// Default: 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`

	// LockTimeout is the lease of an in-flight claim: while the request
	// runs it is renewed every third of this; if its owner dies, a retry
	// takes the key over once the lease has passed. At least 1s, at most
	// 100 years. Default: 30s.
	LockTimeout caddy.Duration `json:"lock_timeout,omitempty"`

	// MaxRequestBody is the largest request body, in bytes, that is
	// fingerprinted; larger bodies get 413 (except with fingerprint none,
	// which does not read the body). Default: 1048576 (1 MiB).
	MaxRequestBody int64 `json:"max_request_body,omitempty"`

	// MaxResponseBody is the largest response body, in bytes, that is
	// stored. Larger responses stream to the client in full, and retries of
	// their key get a 409 problem instead of a replay. Default: 1048576
	// (1 MiB).
	MaxResponseBody int64 `json:"max_response_body,omitempty"`

	// OnStoreError is what happens when the store cannot be reached:
	// fail_closed answers 503 with Retry-After and runs nothing; fail_open
	// runs the request unprotected and logs it. Default: fail_closed.
	OnStoreError string `json:"on_store_error,omitempty"`

	// OnConflict is what a duplicate gets while the first request with its
	// key is still running: "reject" answers 409 with Retry-After at once;
	// "wait" holds the duplicate until the first request ends (then answers
	// it with the replay) or until MaxWait has passed (then 409).
	// Default: reject.
	OnConflict string `json:"on_conflict,omitempty"`

	// MaxWait bounds how long a duplicate waits with on_conflict wait; it
	// must then be positive, and at most 100 years.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// OnUnknownOutcome is what happens to the key of a request that was
	// sent to the upstream but never answered: the connection broke, a
	// timeout such as reverse_proxy's response_header_timeout, or work
	// cancelled one lock_timeout after its client left. The upstream may
	// have carried it out. "release" lets a retry run it again; "keep"
	// holds the key until ttl, and retries get a 502 problem that says the
	// outcome is unknown. A request that never reached an upstream is
	// released either way. Default: release.
	OnUnknownOutcome string `json:"on_unknown_outcome,omitempty"`

	// StoreServerErrors stores 5xx answers and replays them like any
	// other, so a retry does not run again. Without it, a 5xx answer
	// releases the key and a retry runs the request again.
	StoreServerErrors bool `json:"store_server_errors,omitempty"`

	// ReleaseStatuses are the statuses that say a request was not carried
	// out, such as a rate limit's 429 or an expired token's 401: like a
	// 5xx, they release the key and a retry runs the request again instead
	// of getting the refusal replayed until ttl. A list replaces the
	// default. Default: 401, 407, 408, 425, 429.
	ReleaseStatuses []int `json:"release_statuses,omitempty"`

	// ReplayHeader is the response header set to "true" on replays.
	// Default: Idempotent-Replayed.
	ReplayHeader string `json:"replay_header,omitempty"`

	// DisableMetrics turns off this handler's Prometheus metrics, which
	// are otherwise exported on Caddy's metrics endpoint.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// EncryptionKeys seal the stored responses' headers and body with
	// AES-256-GCM: each is 32 bytes in base64, usually a placeholder
	// resolved at provision ({env.IDEMPOTENCY_KEY},
	// {file./run/secrets/idempotency}). The first seals new records; every
	// one opens them, so a key is rotated by putting the new one first. A
	// stored response that none opens is refused with 500, never run again.
	EncryptionKeys []string `json:"encryption_keys,omitempty"`

	// AcceptUnsealed replays the stored responses that are not sealed,
	// as they are stored, for the migration to encryption_keys: turn the
	// keys on with it, and remove it once one ttl has passed. Without it,
	// a handler with encryption_keys refuses such a response with 500 and
	// does not run the request again, since a response it did not seal
	// may have been planted by anyone who can write to the store.
	// Requires encryption_keys.
	AcceptUnsealed bool `json:"accept_unsealed,omitempty"`

	// StoreRaw is the store backend, a module in the
	// http.idempotency.stores namespace. Default: memory.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.idempotency.stores inline_key=module"`
}

// defaults holds every option's documented default.
var defaults = Options{
	KeyHeader:        defaultKeyHeader,
	Methods:          defaultMethods,
	Scope:            DefaultScope,
	ScopeChallenge:   "Bearer",
	ProblemBase:      DefaultProblemBase,
	MinKeyLength:     1,
	Endpoint:         fingerprint.DefaultEndpoint,
	Fingerprint:      fingerprint.Body,
	TTL:              caddy.Duration(defaultTTL),
	LockTimeout:      caddy.Duration(defaultLockTimeout),
	MaxRequestBody:   defaultMaxBody,
	MaxResponseBody:  defaultMaxBody,
	OnStoreError:     FailClosed,
	OnConflict:       ConflictReject,
	OnUnknownOutcome: UnknownRelease,
	ReleaseStatuses:  defaultReleaseStatuses,
	ReplayHeader:     defaultReplayHeader,
}

// SetDefaults fills every option left unset with its documented default.
func (o *Options) SetDefaults() {
	o.Inherit(&defaults)
	for i, m := range o.Methods {
		o.Methods[i] = strings.ToUpper(m)
	}
	if o.OnConflict == ConflictReject {
		o.MaxWait = 0
	}
}

// Inherit fills the options that o leaves unset (zero, or nil for a list)
// from d: the app's defaults, or the documented ones. Each inherited option
// is named here; the options that go together are taken together, and the
// store is not an option a route inherits (it shares the app's instance
// instead). A flag can only be turned on, by either.
func (o *Options) Inherit(d *Options) {
	if o.KeyFrom == nil && o.KeyHeader == "" {
		o.KeyFrom, o.KeyHeader = d.KeyFrom, d.KeyHeader // not a route's header with the app's key_from
	}
	if o.OnConflict == "" {
		o.OnConflict, o.MaxWait = d.OnConflict, d.MaxWait
	}
	if o.Fingerprint == "" {
		o.Fingerprint = d.Fingerprint
	}
	if o.Fingerprint == d.Fingerprint && len(o.FingerprintIgnore) == 0 && len(o.FingerprintOnly) == 0 {
		// the pointers go with the mode: a route with a mode of its own
		// does not take the defaults' pointers for another
		o.FingerprintIgnore, o.FingerprintOnly = slices.Clone(d.FingerprintIgnore), slices.Clone(d.FingerprintOnly)
	}
	inheritList(&o.Methods, d.Methods)
	o.Required = o.Required || d.Required
	inheritValue(&o.Scope, d.Scope)
	o.RequireScope = o.RequireScope || d.RequireScope
	inheritValue(&o.ScopeChallenge, d.ScopeChallenge)
	inheritValue(&o.ProblemBase, d.ProblemBase)
	o.ReplayHeaderAlways = o.ReplayHeaderAlways || d.ReplayHeaderAlways
	inheritValue(&o.ExpiryHeader, d.ExpiryHeader)
	inheritValue(&o.MinKeyLength, d.MinKeyLength)
	inheritValue(&o.ForwardKey, d.ForwardKey)
	inheritValue(&o.Endpoint, d.Endpoint)
	inheritList(&o.FingerprintHeaders, d.FingerprintHeaders)
	inheritValue(&o.TTL, d.TTL)
	inheritValue(&o.LockTimeout, d.LockTimeout)
	inheritValue(&o.MaxRequestBody, d.MaxRequestBody)
	inheritValue(&o.MaxResponseBody, d.MaxResponseBody)
	inheritValue(&o.OnStoreError, d.OnStoreError)
	inheritValue(&o.OnUnknownOutcome, d.OnUnknownOutcome)
	o.StoreServerErrors = o.StoreServerErrors || d.StoreServerErrors
	inheritList(&o.ReleaseStatuses, d.ReleaseStatuses)
	inheritValue(&o.ReplayHeader, d.ReplayHeader)
	o.DisableMetrics = o.DisableMetrics || d.DisableMetrics
	inheritList(&o.EncryptionKeys, d.EncryptionKeys)
	o.AcceptUnsealed = o.AcceptUnsealed || d.AcceptUnsealed
}

// inheritValue sets an option left unset (zero) to its inherited value.
func inheritValue[T comparable](own *T, inherited T) {
	var unset T
	if *own == unset {
		*own = inherited
	}
}

// inheritList sets a list left out (nil) to a copy of its inherited value,
// so that SetDefaults may change Methods in place. A list given empty is
// kept, for Check to refuse.
func inheritList[T any](own *[]T, inherited []T) {
	if *own == nil {
		*own = slices.Clone(inherited)
	}
}

// Check reports the first option that is set to a value it cannot take;
// an option left unset (zero) passes, as it will get its default. It does
// no I/O and compiles nothing: the fingerprint_ignore pointers are
// compiled by Provision.
func (o *Options) Check() error {
	// One rule for every list: left out, it has its default; given, it
	// holds at least one value. An empty list would otherwise say, without
	// a word, "protect no method" or "release no status".
	for _, l := range []struct {
		opt   string
		empty bool
	}{
		{"methods", o.Methods != nil && len(o.Methods) == 0},
		{"release_statuses", o.ReleaseStatuses != nil && len(o.ReleaseStatuses) == 0},
		{"fingerprint_ignore", o.FingerprintIgnore != nil && len(o.FingerprintIgnore) == 0},
		{"fingerprint_only", o.FingerprintOnly != nil && len(o.FingerprintOnly) == 0},
		{"fingerprint_headers", o.FingerprintHeaders != nil && len(o.FingerprintHeaders) == 0},
		{"encryption_keys", o.EncryptionKeys != nil && len(o.EncryptionKeys) == 0},
	} {
		if l.empty {
			return fmt.Errorf("%s: an empty list; leave the option out for its default, or name at least one value", l.opt)
		}
	}
	for _, h := range []struct{ opt, name string }{
		{"key_header", o.KeyHeader}, {"forward_key", o.ForwardKey}, {"replay_header", o.ReplayHeader},
		{"expiry_header", o.ExpiryHeader},
	} {
		if h.name != "" && !validToken(h.name) {
			return fmt.Errorf("%s: invalid header name %q", h.opt, h.name)
		}
	}
	if f := o.KeyFrom; f != nil {
		switch {
		case (f.Query == "") == (f.JSON == ""):
			return fmt.Errorf("key_from: name one of query and json, got %+v", *f)
		case o.KeyHeader != defaultKeyHeader && o.KeyHeader != "":
			return fmt.Errorf("key_from and key_header name two places for the key: choose one")
		}
	}
	if u, err := url.Parse(o.ProblemBase); o.ProblemBase != "" && (err != nil || !u.IsAbs() || u.Fragment != "" || strings.Contains(o.ProblemBase, "#")) {
		return fmt.Errorf("problem_base: want an absolute URI without a fragment, got %q", o.ProblemBase)
	}
	if strings.ContainsFunc(o.ScopeChallenge, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("require_scope: the challenge %q holds a control character", o.ScopeChallenge)
	}
	for _, m := range o.Methods {
		if !validToken(m) {
			return fmt.Errorf("methods: invalid method %q", m)
		}
	}
	switch o.Fingerprint {
	case "", fingerprint.Body, fingerprint.JSON, fingerprint.None:
	default:
		return fmt.Errorf("fingerprint: want body, json or none, got %q", o.Fingerprint)
	}
	if len(o.FingerprintOnly) > 0 && o.Fingerprint != fingerprint.JSON {
		return fmt.Errorf("fingerprint_only applies only with fingerprint json, not %s", cmp.Or(o.Fingerprint, fingerprint.Body))
	}
	if len(o.FingerprintOnly) > 0 && len(o.FingerprintIgnore) > 0 {
		return fmt.Errorf("fingerprint_only and fingerprint_ignore are two ways to say what counts: use one")
	}
	if len(o.FingerprintIgnore) > 0 && o.Fingerprint != fingerprint.JSON {
		return fmt.Errorf("fingerprint_ignore applies only with fingerprint json, not %s", cmp.Or(o.Fingerprint, fingerprint.Body))
	}
	for _, name := range o.FingerprintHeaders {
		if !validToken(name) {
			return fmt.Errorf("fingerprint_headers: invalid header name %q", name)
		}
	}
	for _, d := range []struct {
		opt string
		d   caddy.Duration
	}{{"ttl", o.TTL}, {"lock_timeout", o.LockTimeout}, {"max_wait", o.MaxWait}} {
		if time.Duration(d.d) > maxDuration {
			return fmt.Errorf("%s: %v is more than 100 years", d.opt, time.Duration(d.d))
		}
	}
	switch {
	case o.TTL < 0:
		return fmt.Errorf("ttl must be positive: %v", time.Duration(o.TTL))
	case o.LockTimeout != 0 && o.LockTimeout < caddy.Duration(time.Second):
		return fmt.Errorf("lock_timeout must be at least 1s: %v", time.Duration(o.LockTimeout))
	case o.MinKeyLength < 0 || o.MinKeyLength > store.MaxClientKeyLen:
		return fmt.Errorf("min_key_length: want 1 to %d, got %d", store.MaxClientKeyLen, o.MinKeyLength)
	case o.MaxRequestBody < 0:
		return fmt.Errorf("max_request_body must be positive: %d", o.MaxRequestBody)
	case o.MaxResponseBody < 0:
		return fmt.Errorf("max_response_body must be positive: %d", o.MaxResponseBody)
	}
	if err := oneOf("on_store_error", o.OnStoreError, FailClosed, FailOpen); err != nil {
		return err
	}
	if err := oneOf("on_conflict", o.OnConflict, ConflictReject, ConflictWait); err != nil {
		return err
	}
	if o.OnConflict == ConflictWait && o.MaxWait <= 0 {
		return fmt.Errorf("on_conflict wait needs a positive max_wait, got %v", time.Duration(o.MaxWait))
	}
	if err := oneOf("on_unknown_outcome", o.OnUnknownOutcome, UnknownRelease, UnknownKeep); err != nil {
		return err
	}
	for _, status := range o.ReleaseStatuses {
		if status < 400 || status > 599 {
			return fmt.Errorf("release_statuses: want 4xx or 5xx statuses, got %d", status)
		}
	}
	if o.AcceptUnsealed && len(o.EncryptionKeys) == 0 {
		return fmt.Errorf("accept_unsealed applies only with encryption_keys: without keys, every stored response is replayed as it is stored")
	}
	return nil
}

// oneOf checks that an option, if set, is one of its two values.
func oneOf(opt, v, a, b string) error {
	if v != "" && v != a && v != b {
		return fmt.Errorf("%s: want %s or %s, got %q", opt, a, b, v)
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token (a header name or a
// method).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
