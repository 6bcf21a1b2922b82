package store

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// Inspector is implemented by stores that let an operator look at their
// records and purge them: the admin API and the `caddy idempotency` command
// use it. It is separate from Store because the handler never needs it.
//
// Its methods see the same live records as Acquire: a record whose lease or
// TTL has passed is absent, whether or not the backend has deleted it yet.
type Inspector interface {
	// Lookup returns the live record of key and when it expires (the end
	// of the lease while in progress, of the TTL once completed; zero if
	// the backend keeps it without expiry), or a nil record if there is
	// none. The record is the whole record, body included.
	Lookup(ctx context.Context, key Key) (rec *Record, expiresAt time.Time, err error)

	// Delete removes key's record whatever its state and owner, and
	// reports whether a live record was there. Deleting an in-progress
	// claim lets a retry run while its first request may still be running:
	// the owner's Complete then fails with ErrNotOwner.
	Delete(ctx context.Context, key Key) (bool, error)

	// InFlight lists at most limit in-progress claims created at least
	// olderThan ago, oldest first among those it found. Stores that can
	// only scan their keys (Redis) stop once they have found limit claims,
	// which are then not necessarily the oldest of all.
	InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]Entry, error)
}

// Summary is what a listing tells of a record: everything but the owner
// token, the fingerprint, the headers and the body, whose size alone is
// given.
type Summary struct {
	State     State
	Endpoint  string
	CreatedAt time.Time
	Status    int
	BodySize  int
	Truncated bool
}

// Summarize returns the summary of rec.
func Summarize(rec *Record) Summary {
	return Summary{
		State:     rec.State,
		Endpoint:  rec.Endpoint,
		CreatedAt: rec.CreatedAt,
		Status:    rec.Status,
		BodySize:  len(rec.Body),
		Truncated: rec.Truncated,
	}
}

// Entry is one record of a listing.
type Entry struct {
	Key Key
	Summary
	// ExpiresAt is when the lease (in progress) or the TTL (completed)
	// ends; zero if the backend keeps the record without expiry.
	ExpiresAt time.Time
}

// SortEntries orders entries oldest first, then by key, and keeps at most
// limit of them. Every Inspector returns its listing this way.
func SortEntries(entries []Entry, limit int) []Entry {
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(string(a.Key[:]), string(b.Key[:]))
	})
	if limit < 0 {
		limit = 0
	}
	if len(entries) > limit {
		entries = entries[:limit]
	}
	return entries
}

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
