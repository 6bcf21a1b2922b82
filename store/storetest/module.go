package storetest

import (
	"context"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Module is what Caddy sees of a store module.
type Module interface {
	store.Store
	caddy.Provisioner
	caddy.Validator
	caddy.CleanerUpper
}

// Provision provisions m as Caddy would, validates it, and cleans it up
// when the test ends.
func Provision[M Module](t testing.TB, m M) M {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return m
}

// Registered returns the store registered under name, or nil.
func Registered(name string) store.Store {
	for _, r := range store.Registered() {
		if r.Name == name {
			return r.Store
		}
	}
	return nil
}
