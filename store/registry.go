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

// The registry of provisioned stores: every store module registers itself
// when it is provisioned and unregisters when it is cleaned up, so that the
// admin API, which Caddy provisions apart from any config, can reach them,
// and so that the handler labels its metrics and spans with the name the
// operator reads in `caddy idempotency stores`.
//
// Configs share a store's client or table through usage pools, so several
// module instances (of one config, or of the old and new config during a
// reload) can stand for the same records: they register under the same
// name, and the name stays registered until the last of them is cleaned up.
var registry = struct {
	sync.Mutex
	stores map[string][]entry // by name, in order of registration
}{stores: make(map[string][]entry)}

type entry struct {
	Registration
	records string // the store's default name, which identifies its records
	// config is the Done channel of the context of the config that
	// provisioned the store, which tells one config's stores from another's
	// (Caddy provisions every module of a config in contexts derived from
	// one); nil outside a config.
	config <-chan struct{}
	holds  *Holds // the requests that use the store (holds.go)
}

// Registration is a registered store.
type Registration struct {
	// Name is what operators call the store: the name its config gives
	// it, else its default name.
	Name string
	// Module is the store module's name: memory, redis, file, postgres.
	Module string
	Store  Store
}

// Register records that reg.Store is provisioned, under reg.Name, by the
// config whose context is ctx (nil outside a config). records is the
// store's default name: it identifies the records the store holds, not its
// client settings (the same Redis database and key prefix, the same file,
// the same table, the same memory table), reads as a person would write
// it, and never holds a secret.
//
// Within one config a name stands for one set of records and a set of
// records has one name: a name given to stores that hold different
// records, or two names given to the same records, are errors. Across
// configs they are not, so that a reload may move a name to other records;
// until the old config is cleaned up, Registered shows the newer store.
// On error nothing is registered.
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
// metrics label or a command line: empty, with surrounding spaces, or with
// characters that do not print.
func checkName(name string) error {
	if name == "" || strings.TrimSpace(name) != name || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("store name %q: want printable characters, without leading or trailing spaces", name)
	}
	return nil
}

// Unregister undoes Register for s under name. It is safe to call more
// than once, or for a store that was never registered.
func Unregister(name string, s Store) { unregister(name, s) }

// unregister is Unregister, returning the holds of s if it was registered,
// and whether another store is registered for the same records: the store
// of a config that replaced s's.
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

// Detach undoes what a store's Provision did with a shared backend: it
// unregisters s from name and gives back its use of the pooled resource at
// *poolKey (a caddy.UsagePool, which destroys the resource with its last
// user). While requests hold s (HoldsOf), the give-back waits for the last
// of them, within a bound (holds.go), and an error closing the resource is
// logged rather than returned. It clears *poolKey, so that a second call,
// or one for a store that never got the resource, does nothing.
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

// usagePool is what Detach needs of the caddy.UsagePool of a store's
// backends.
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
	for _, list := range registry.stores {
		for _, e := range list {
			if e.Store == s {
				return e.Registration, true
			}
		}
	}
	return Registration{}, false
}
