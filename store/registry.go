package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode"
)

// The registry of provisioned stores, through which the admin API (which
// Caddy provisions apart from any config) reaches them. Module instances
// that share one backend (in one config, or across a reload) register under
// one name, which stays until the last of them is cleaned up.
var registry = struct {
	sync.Mutex
	stores map[string][]entry // by name, in order of registration
}{stores: make(map[string][]entry)}

type entry struct {
	Registration
	records string // the store's default name, which identifies its records
	// config is the Done channel of the provisioning config's context (all
	// of a config's module contexts derive from one); nil outside a config.
	config <-chan struct{}
	holds  *Holds // the requests that use the store (holds.go)
}

// Registration is a registered store.
type Registration struct {
	Name   string // its configured name, else its default name
	Module string // memory, redis, file, postgres
	Store  Store
}

// Register records that reg.Store is provisioned, under reg.Name, by the
// config whose context is ctx (nil outside a config). records is the
// store's default name, which identifies its records and holds no secret.
// Within one config a name stands for one set of records and a set of
// records has one name; across configs not, so that a reload may move a
// name. On error nothing is registered.
func Register(ctx context.Context, reg Registration, records string) error {
	if err := checkName(reg.Name); err != nil {
		return err
	}
	var config <-chan struct{}
	if ctx != nil {
		config = ctx.Done()
	}
	registry.Lock()
	defer registry.Unlock()
	if config != nil {
		for _, list := range registry.stores {
			for _, e := range list {
				switch {
				case e.config != config:
				case e.Name == reg.Name && e.records != records:
					return fmt.Errorf("store name '%s' is already given to other records in this config (%s): stores that hold different records need different names", reg.Name, e.records)
				case e.records == records && e.Name != reg.Name:
					return fmt.Errorf("the records of %s are already named '%s' in this config: give every store that holds them the same name", records, e.Name)
				}
			}
		}
	}
	registry.stores[reg.Name] = append(registry.stores[reg.Name], entry{Registration: reg, records: records, config: config, holds: new(Holds)})
	return nil
}

// checkName refuses names that would not read as one word in a listing, a
// metrics label or a command line.
func checkName(name string) error {
	if name == "" || strings.TrimSpace(name) != name || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("store name %q: want printable characters, without leading or trailing spaces", name)
	}
	return nil
}

// unregister undoes Register for s under name, returning the holds of s if
// it was registered, and whether another store (of a config that replaced
// s's) is still registered under name. It is safe to call more than once,
// or for a store that was never registered.
func unregister(name string, s Store) (holds *Holds, replaced bool) {
	registry.Lock()
	defer registry.Unlock()
	list := registry.stores[name]
	if i := slices.IndexFunc(list, func(e entry) bool { return e.Store == s }); i >= 0 {
		holds = list[i].holds
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(registry.stores, name)
	} else {
		registry.stores[name] = list
	}
	return holds, len(list) > 0
}

// Detach undoes a store's Provision: it unregisters s from name and gives
// back its use of the pooled resource at *poolKey once no request holds s
// (Holds); an error closing it later is logged. It clears *poolKey, so
// that a second call does nothing.
func Detach(s Store, name string, pool usagePool, poolKey *string) error {
	if *poolKey == "" {
		return nil
	}
	holds, replaced := unregister(name, s)
	key := *poolKey
	*poolKey = ""
	if n, _ := pool.References(key); n > 1 {
		replaced = false // another config uses the same backend: it stays open
	}
	if closeLater(holds, replaced, name, pool, key) {
		return nil
	}
	_, err := pool.Delete(key)
	return err
}

// usagePool is what Detach needs of a caddy.UsagePool.
type usagePool interface {
	Delete(key any) (bool, error)
	References(key any) (int, bool)
}

// Registered returns the registered stores, one per name (the instance
// registered last), sorted by name.
func Registered() []Registration {
	registry.Lock()
	defer registry.Unlock()
	out := make([]Registration, 0, len(registry.stores))
	for _, list := range registry.stores {
		out = append(out, list[len(list)-1].Registration)
	}
	slices.SortFunc(out, func(a, b Registration) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// RegistrationOf returns the registration of s, if s is registered.
func RegistrationOf(s Store) (Registration, bool) {
	registry.Lock()
	defer registry.Unlock()
	e, ok := find(s)
	return e.Registration, ok
}

// find returns the entry of s. The caller holds the registry's lock.
func find(s Store) (entry, bool) {
	for _, list := range registry.stores {
		for _, e := range list {
			if e.Store == s {
				return e, true
			}
		}
	}
	return entry{}, false
}
