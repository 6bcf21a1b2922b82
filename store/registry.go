package store

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// The registry of provisioned stores: every store module registers itself
// when it is provisioned and unregisters when it is cleaned up, so that the
// admin API, which Caddy provisions apart from any config, can reach them.
//
// Configs share a store's client or table through usage pools, so several
// module instances (of one config, or of the old and new config during a
// reload) can stand for the same records: they register under the same
// name, and the name stays registered until the last of them is cleaned up.
var registry = struct {
	sync.Mutex
	stores map[string][]Store // by name, in order of registration
}{stores: make(map[string][]Store)}

// Register records that s is provisioned under name, which identifies the
// records it holds, not its client settings: stores that see the same
// records (the same Redis database and key prefix, the same file, the same
// table, the same memory table) must use the same name, and others a
// different one. Names start with the store's module name and a colon, as
// in "redis:127.0.0.1:6379/0/idempotency", and never hold a secret.
func Register(name string, s Store) {
	registry.Lock()
	defer registry.Unlock()
	registry.stores[name] = append(registry.stores[name], s)
}

// Unregister undoes Register(name, s). It is safe to call more than once,
// or for a store that was never registered.
func Unregister(name string, s Store) {
	registry.Lock()
	defer registry.Unlock()
	list := registry.stores[name]
	if i := slices.Index(list, s); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(registry.stores, name)
	} else {
		registry.stores[name] = list
	}
}

// Registration is a registered store and its name.
type Registration struct {
	Name  string
	Store Store
}

// Module is the module name that starts the registration's name.
func (r Registration) Module() string {
	m, _, _ := strings.Cut(r.Name, ":")
	return m
}

// Detach undoes what a store's Provision did with a shared backend: it
// unregisters s from name and gives back its use of the pooled resource at
// *poolKey (a caddy.UsagePool, which destroys the resource with its last
// user). It clears *poolKey, so that a second call, or one for a store that
// never got the resource, does nothing.
func Detach(s Store, name string, pool interface{ Delete(key any) (bool, error) }, poolKey *string) error {
	if *poolKey == "" {
		return nil
	}
	Unregister(name, s)
	key := *poolKey
	*poolKey = ""
	_, err := pool.Delete(key)
	return err
}

// Registered returns the registered stores, one per name (the instance
// registered last), sorted by name.
func Registered() []Registration {
	registry.Lock()
	defer registry.Unlock()
	out := make([]Registration, 0, len(registry.stores))
	for name, list := range registry.stores {
		out = append(out, Registration{Name: name, Store: list[len(list)-1]})
	}
	slices.SortFunc(out, func(a, b Registration) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
