package admin

import (
	"context"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/admintest"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/memory"
)

// openMemory provisions a memory store with a table of its own, which
// registers it for the admin API.
func openMemory(t *testing.T) *memory.Memory {
	t.Helper()
	m := &memory.Memory{Name: "memory-" + strconv.FormatInt(testSeq.Add(1), 10)}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Cleanup() })
	return m
}

var testSeq atomic.Int64

// plain is a store that cannot be inspected.
type plain struct{ store.Store }

func TestAdminStores(t *testing.T) {
	mem := openMemory(t)
	regs := []store.Registration{{Name: "orders", Module: "memory", Store: mem}, {Name: "legacy", Module: "other", Store: plain{mem}}}
	srv := admintest.Server(t, &adminAPI{stores: func() []store.Registration { return regs }})
	var got []StoreInfo
	admintest.Call(t, srv, "GET", "/idempotency/stores", 200, &got)
	want := []StoreInfo{{Name: "orders", Module: "memory", Inspector: true}, {Name: "legacy", Module: "other", Inspector: false}}
	if !slices.Equal(got, want) {
		t.Fatalf("stores = %+v, want %+v", got, want)
	}

	// Without an injected list, the registry's stores are served.
	own := openMemory(t)
	srv = admintest.Server(t, &adminAPI{})
	admintest.Call(t, srv, "GET", "/idempotency/stores", 200, &got)
	found := false
	for _, s := range got {
		found = found || (s.Name == own.Name && s.Module == "memory")
	}
	if !found {
		t.Fatalf("stores = %+v, want the provisioned memory store", got)
	}
}

// Which store a request means: the only one, its name, a module name that
// only one store has; anything else is refused with the names.
func TestAdminStoreChoice(t *testing.T) {
	a, b := openMemory(t), openMemory(t)
	var regs []store.Registration
	srv := admintest.Server(t, &adminAPI{stores: func() []store.Registration { return regs }})
	k := store.NewKey("", "k1")
	path := "/idempotency/keys/" + k.String()
	if got, err := a.Acquire(context.Background(), k, &store.Claim{Lease: time.Minute, Endpoint: "POST in/a", CreatedAt: time.Now()}); got.Record != nil || err != nil {
		t.Fatal(got.Record, err)
	}

	admintest.WantError(t, srv, "GET", path, 404, "no idempotency store is provisioned")
	admintest.WantError(t, srv, "GET", "/idempotency/stuck", 404, "no idempotency store is provisioned")

	regs = []store.Registration{{Name: "orders", Module: "memory", Store: a}}
	var info KeyInfo
	admintest.Call(t, srv, "GET", path, 200, &info) // the only store: store= may be left out
	if info.Store != "orders" || info.Endpoint != "POST in/a" {
		t.Fatalf("lookup in the only store = %+v", info)
	}

	regs = []store.Registration{{Name: "legacy", Module: "other", Store: plain{a}}, {Name: "memory (5 records, 1MiB)", Module: "memory", Store: b}, {Name: "orders", Module: "memory", Store: a}}
	admintest.WantError(t, srv, "GET", path, 400, "3 stores are provisioned; choose one with store=<name> (--store on the command line): legacy, memory (5 records, 1MiB), orders")
	admintest.WantError(t, srv, "GET", path+"?store=memory", 400, "2 memory stores are provisioned; choose one with its full name")
	admintest.WantError(t, srv, "GET", path+"?store=redis", 404, `no store "redis"; provisioned stores: legacy, memory (5 records, 1MiB), orders`)
	admintest.WantError(t, srv, "GET", path+"?store="+url.QueryEscape("memory (5 records, 1MiB)"), 404, "no record for key "+k.String()+" in store memory (5 records, 1MiB)")
	admintest.WantError(t, srv, "GET", path+"?store=other", 501, "store legacy cannot be inspected")
	admintest.WantError(t, srv, "GET", path+"?store=legacy", 501, "store legacy cannot be inspected")
	admintest.Call(t, srv, "GET", path+"?store=orders", 200, &info)
	if info.Store != "orders" || info.Endpoint != "POST in/a" {
		t.Fatalf("lookup in the store named orders = %+v", info)
	}

	regs = []store.Registration{{Name: "orders", Module: "memory", Store: a}, {Name: "legacy", Module: "other", Store: plain{a}}}
	admintest.Call(t, srv, "GET", path+"?store=memory", 200, &info) // the one memory store
	if info.Store != "orders" {
		t.Fatalf("lookup in the one memory store = %+v", info)
	}
}

func TestAdminBadRequests(t *testing.T) {
	mem := openMemory(t)
	srv := admintest.Server(t, &adminAPI{stores: func() []store.Registration {
		return []store.Registration{{Name: "memory", Module: "memory", Store: mem}}
	}})
	hash := store.NewKey("", "k").String()
	for _, tc := range []struct {
		method, path string
		status       int
		want         string
	}{
		{"GET", "/idempotency/keys/abc", 400, "not a key hash"},
		{"GET", "/idempotency/keys/" + strings.Repeat("zz", 32), 400, "not a key hash"},
		{"GET", "/idempotency/keys", 400, "missing key hash: use /idempotency/keys/<hash>"},
		// The raw key and scope are never taken: the admin log writes the URI.
		{"GET", "/idempotency/keys?key=k&scope=alice", 400, "the API takes a key's hash, not the key: use /idempotency/keys/<hash>"},
		{"DELETE", "/idempotency/keys/" + hash + "?key=k", 400, "the API takes a key's hash, not the key"},
		{"GET", "/idempotency/stuck?older_than=soon", 400, "older_than"},
		{"GET", "/idempotency/stuck?older_than=-1s", 400, "older_than"},
		{"GET", "/idempotency/stuck?limit=0", 400, "limit"},
		{"GET", "/idempotency/stuck?limit=10001", 400, "limit"},
		{"GET", "/idempotency/stuck?limit=many", 400, "limit"},
		{"POST", "/idempotency/keys/" + hash, 405, "method POST not allowed"},
		{"PUT", "/idempotency/keys/" + hash, 405, "use GET or DELETE"},
		{"DELETE", "/idempotency/stuck", 405, "use GET"},
		{"DELETE", "/idempotency/stores", 405, "use GET"},
		{"GET", "/idempotency/", 404, "resource not found"},
		{"GET", "/idempotency/nope", 404, "resource not found"},
		{"GET", "/idempotency/keys/" + hash + "/more", 400, "not a key hash"},
	} {
		admintest.WantError(t, srv, tc.method, tc.path, tc.status, tc.want)
	}
	// Upper-case hex is a hash as well; stuck's defaults.
	admintest.WantError(t, srv, "GET", "/idempotency/keys/"+strings.ToUpper(hash), 404, "no record for key "+hash)
	var stuck StuckList
	admintest.Call(t, srv, "GET", "/idempotency/stuck", 200, &stuck)
	if stuck.OlderThan != "30s" || stuck.Limit != 100 || stuck.Claims == nil {
		t.Fatalf("stuck defaults = %+v", stuck)
	}
	admintest.Call(t, srv, "GET", "/idempotency/stuck?older_than=1d", 200, &stuck) // Caddy's day unit
	if stuck.OlderThan != "24h0m0s" {
		t.Fatalf("older_than=1d = %q", stuck.OlderThan)
	}
}

func TestAdminModule(t *testing.T) {
	mod, err := caddy.GetModule("admin.api.idempotency")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mod.New().(caddy.AdminRouter); !ok {
		t.Fatal("admin.api.idempotency is not an AdminRouter")
	}
}
