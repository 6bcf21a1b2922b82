// Package admin is the idempotency stores' operator interface: the
// admin.api.idempotency module, which serves /idempotency/ on Caddy's admin
// endpoint, and the caddy idempotency command, which calls it.
package admin

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

const (
	adminBase         = "/idempotency/"
	adminTimeout      = 30 * time.Second
	defaultOlderThan  = 30 * time.Second
	defaultStuckLimit = 100
	maxStuckLimit     = 10000
)

// adminAPI serves /idempotency/ on Caddy's admin endpoint, for every store
// the running configs provisioned. It never returns stored bodies or headers.
//
//	GET    /idempotency/stores
//	GET    /idempotency/keys/<hash>[?store=<name>]
//	DELETE /idempotency/keys/<hash>[?store=<name>]
//	GET    /idempotency/stuck[?older_than=30s][&limit=100][&store=<name>]
//
// Keys are named by hash only: Caddy's admin logger logs every request URI.
type adminAPI struct {
	// stores lists the stores to serve; nil means every registered store.
	stores func() []store.Registration
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.idempotency",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminBase, Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// StoreInfo is one element of GET /idempotency/stores.
type StoreInfo struct {
	Name      string `json:"name"`
	Module    string `json:"module"`
	Inspector bool   `json:"inspector"`
}

// KeyInfo is a record as the API shows it, the same for every store.
type KeyInfo struct {
	Store          string     `json:"store,omitempty"`
	Key            string     `json:"key"`
	State          string     `json:"state"`
	Endpoint       string     `json:"endpoint"`
	Status         int        `json:"status,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	Age            string     `json:"age"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	ExpiresIn      string     `json:"expires_in,omitempty"`
	BodySize       int        `json:"body_size"`
	Truncated      bool       `json:"truncated"`
	OutcomeUnknown bool       `json:"outcome_unknown"`
}

// Purged is the answer to a DELETE.
type Purged struct {
	Store   string `json:"store"`
	Key     string `json:"key"`
	Deleted bool   `json:"deleted"`
}

// StuckList is the answer to GET /idempotency/stuck.
type StuckList struct {
	Store     string    `json:"store"`
	OlderThan string    `json:"older_than"`
	Limit     int       `json:"limit"`
	Claims    []KeyInfo `json:"claims"`
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	switch path := strings.TrimPrefix(r.URL.Path, adminBase); {
	case path == "stores":
		if err := allow(r, http.MethodGet); err != nil {
			return err
		}
		return a.listStores(w)
	case path == "keys" || strings.HasPrefix(path, "keys/"):
		if err := allow(r, http.MethodGet, http.MethodDelete); err != nil {
			return err
		}
		return a.serveKey(ctx, w, r, strings.TrimPrefix(strings.TrimPrefix(path, "keys"), "/"))
	case path == "stuck":
		if err := allow(r, http.MethodGet); err != nil {
			return err
		}
		return a.listStuck(ctx, w, r)
	}
	return apiError(http.StatusNotFound, "resource not found: %s (try %sstores, %skeys/<hash> or %sstuck)",
		r.URL.Path, adminBase, adminBase, adminBase)
}

func (a *adminAPI) listStores(w http.ResponseWriter) error {
	out := []StoreInfo{}
	for _, reg := range a.registered() {
		_, ok := reg.Store.(store.Inspector)
		out = append(out, StoreInfo{Name: reg.Name, Module: reg.Module, Inspector: ok})
	}
	return writeJSON(w, out)
}

func (a *adminAPI) serveKey(ctx context.Context, w http.ResponseWriter, r *http.Request, hash string) error {
	q := r.URL.Query()
	key, err := keyFromRequest(hash, q)
	if err != nil {
		return err
	}
	name, in, err := a.pick(q.Get("store"))
	if err != nil {
		return err
	}
	if r.Method == http.MethodDelete {
		found, err := in.Delete(ctx, key)
		if err != nil {
			return storeError("deleting", name, err)
		}
		if !found {
			return apiError(http.StatusNotFound, "no record for key %s in store %s", key, name)
		}
		caddy.Log().Named("admin.api.idempotency").Info("purged a key",
			zap.String("key_hash", key.String()), zap.String("store", name), zap.String("remote_addr", r.RemoteAddr))
		return writeJSON(w, Purged{Store: name, Key: key.String(), Deleted: true})
	}
	rec, expires, err := in.Lookup(ctx, key)
	if err != nil {
		return storeError("looking up", name, err)
	}
	if rec == nil {
		return apiError(http.StatusNotFound, "no record for key %s in store %s", key, name)
	}
	summary := store.Summarize(rec)
	summary.BodySize = sealing.BodySize(rec)
	info := describe(key, summary, expires, time.Now())
	info.Store = name
	return writeJSON(w, info)
}

func (a *adminAPI) listStuck(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	olderThan := defaultOlderThan
	if v := q.Get("older_than"); v != "" {
		d, err := caddy.ParseDuration(v)
		if err != nil || d < 0 {
			return apiError(http.StatusBadRequest, "older_than: %q is not a non-negative duration such as 30s or 5m", v)
		}
		olderThan = d
	}
	limit := defaultStuckLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxStuckLimit {
			return apiError(http.StatusBadRequest, "limit: %q is not a number from 1 to %d", v, maxStuckLimit)
		}
		limit = n
	}
	name, in, err := a.pick(q.Get("store"))
	if err != nil {
		return err
	}
	entries, err := in.InFlight(ctx, olderThan, limit)
	if err != nil {
		return storeError("listing claims", name, err)
	}
	out := StuckList{Store: name, OlderThan: olderThan.String(), Limit: limit, Claims: []KeyInfo{}}
	now := time.Now()
	for _, e := range entries {
		out.Claims = append(out.Claims, describe(e.Key, e.Summary, e.ExpiresAt, now))
	}
	return writeJSON(w, out)
}

// keyFromRequest reads the key's hash from the path. A client key or scope
// in the query, which the admin log would record, is refused.
func keyFromRequest(hash string, q map[string][]string) (store.Key, error) {
	_, hasKey := q["key"]
	_, hasScope := q["scope"]
	switch {
	case hasKey || hasScope:
		return store.Key{}, apiError(http.StatusBadRequest, "the API takes a key's hash, not the key: use %skeys/<hash> (caddy idempotency inspect <key> --scope <scope> computes it)", adminBase)
	case hash == "":
		return store.Key{}, apiError(http.StatusBadRequest, "missing key hash: use %skeys/<hash>", adminBase)
	}
	b, err := hex.DecodeString(hash)
	if err != nil || len(b) != len(store.Key{}) {
		return store.Key{}, apiError(http.StatusBadRequest, "not a key hash: want 64 hex digits")
	}
	return store.Key(b), nil
}

func (a *adminAPI) registered() []store.Registration {
	if a.stores != nil {
		return a.stores()
	}
	return store.Registered()
}

// pick finds the store that name designates: its full name, its module
// name if only one store has that module, or "" if only one store exists.
func (a *adminAPI) pick(name string) (string, store.Inspector, error) {
	regs := a.registered()
	names := make([]string, len(regs))
	var match, ofModule []store.Registration
	for i, reg := range regs {
		names[i] = reg.Name
		if name == "" || reg.Name == name {
			match = append(match, reg)
		} else if reg.Module == name {
			ofModule = append(ofModule, reg)
		}
	}
	if len(match) == 0 {
		match = ofModule
	}
	switch {
	case len(regs) == 0:
		return "", nil, apiError(http.StatusNotFound, "no idempotency store is provisioned: does the running config use the idempotency handler?")
	case len(match) == 0:
		return "", nil, apiError(http.StatusNotFound, "no store %q; provisioned stores: %s", name, strings.Join(names, ", "))
	case len(match) > 1 && name == "":
		return "", nil, apiError(http.StatusBadRequest, "%d stores are provisioned; choose one with store=<name> (--store on the command line): %s", len(match), strings.Join(names, ", "))
	case len(match) > 1:
		return "", nil, apiError(http.StatusBadRequest, "%d %s stores are provisioned; choose one with its full name: %s", len(match), name, strings.Join(names, ", "))
	}
	in, ok := match[0].Store.(store.Inspector)
	if !ok {
		return "", nil, apiError(http.StatusNotImplemented, "store %s cannot be inspected", match[0].Name)
	}
	return match[0].Name, in, nil
}

// describe shows a summary, its age and time left at now, UTC to the ms.
func describe(key store.Key, s store.Summary, expires time.Time, now time.Time) KeyInfo {
	info := KeyInfo{
		Key:            key.String(),
		State:          s.State.String(),
		Endpoint:       s.Endpoint,
		Status:         s.Status,
		CreatedAt:      s.CreatedAt.UTC().Truncate(time.Millisecond),
		Age:            max(now.Sub(s.CreatedAt), 0).Round(time.Millisecond).String(),
		BodySize:       s.BodySize,
		Truncated:      s.Truncated,
		OutcomeUnknown: s.OutcomeUnknown,
	}
	if !expires.IsZero() {
		t := expires.UTC().Truncate(time.Millisecond)
		info.ExpiresAt = &t
		info.ExpiresIn = max(expires.Sub(now), 0).Round(time.Millisecond).String()
	}
	return info
}

func allow(r *http.Request, methods ...string) error {
	for _, m := range methods {
		if r.Method == m {
			return nil
		}
	}
	return caddy.APIError{
		HTTPStatus: http.StatusMethodNotAllowed,
		Err:        fmt.Errorf("method %s not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(methods, " or ")),
	}
}

func apiError(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

// storeError answers 503 for an unavailable store, as the handler does, else 500.
func storeError(op, name string, err error) error {
	status := http.StatusInternalServerError
	if errors.Is(err, store.ErrUnavailable) {
		status = http.StatusServiceUnavailable
	}
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf("%s in store %s: %w", op, name, err)}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var (
	_ caddy.Module      = (*adminAPI)(nil)
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
