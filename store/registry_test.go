package store

import (
	"context"
	"testing"
	"time"
)

// fake is a Store that does nothing, for the registry's tests.
type fake struct{ id int }

func (*fake) Acquire(context.Context, Key, *Claim) (*Record, error)               { return nil, nil }
func (*fake) Complete(context.Context, Key, *Claim, *Record, time.Duration) error { return nil }
func (*fake) Release(context.Context, Key, Token) error                           { return nil }
func (*fake) Renew(context.Context, Key, Token, time.Duration) error              { return nil }

// registered returns the store registered under name, or nil.
func registered(name string) Store {
	for _, r := range Registered() {
		if r.Name == name {
			return r.Store
		}
	}
	return nil
}

func TestRegistry(t *testing.T) {
	const name = "fake:registry-test"
	a, b := &fake{1}, &fake{2}
	t.Cleanup(func() { Unregister(name, a); Unregister(name, b) })

	Register(name, a)
	if got := registered(name); got != a {
		t.Fatalf("registered %v, want a", got)
	}
	// A reload: the new config's instance registers before the old one is
	// cleaned up, and the name stays until the last one goes.
	Register(name, b)
	if got := registered(name); got != b {
		t.Fatalf("registered %v after the second registration, want b", got)
	}
	Unregister(name, a)
	Unregister(name, a) // twice is harmless
	if got := registered(name); got != b {
		t.Fatalf("registered %v after a's cleanup, want b", got)
	}
	Unregister(name, b)
	if got := registered(name); got != nil {
		t.Fatalf("registered %v after every cleanup, want none", got)
	}
	Unregister("fake:never", a) // unknown names are harmless
}

func TestRegisteredIsSorted(t *testing.T) {
	s := &fake{}
	for _, n := range []string{"fake:b", "fake:a", "fake:c"} {
		Register(n, s)
		t.Cleanup(func() { Unregister(n, s) })
	}
	var names []string
	for _, r := range Registered() {
		if r.Module() == "fake" {
			names = append(names, r.Name)
		}
	}
	if len(names) != 3 || names[0] != "fake:a" || names[1] != "fake:b" || names[2] != "fake:c" {
		t.Fatalf("Registered names %v, want sorted", names)
	}
}
