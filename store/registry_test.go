package store

import (
	"context"
	"strings"
	"testing"
	"time"
)

// fake is a Store that does nothing, for the registry's tests.
type fake struct{ id int }

func (*fake) Acquire(context.Context, Key, *Claim) (Acquired, error)                { return Acquired{}, nil }
func (*fake) Complete(context.Context, Key, *Claim, *Response, time.Duration) error { return nil }
func (*fake) Release(context.Context, Key, Token) error                             { return nil }
func (*fake) Renew(context.Context, Key, Token, time.Duration) error                { return nil }

// registered returns the store registered under name, or nil.
func registered(name string) Store {
	for _, r := range Registered() {
		if r.Name == name {
			return r.Store
		}
	}
	return nil
}

// register registers s under name for the records, with the test's
// module name, and fails the test if the registry refuses.
func register(t *testing.T, ctx context.Context, name, records string, s Store) {
	t.Helper()
	if err := Register(ctx, Registration{Name: name, Module: "fake", Store: s}, records); err != nil {
		t.Fatalf("Register(%q, %q): %v", name, records, err)
	}
	t.Cleanup(func() { unregister(name, s) })
}

// config is the context of one config, as Caddy gives its modules.
func config(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func TestRegistry(t *testing.T) {
	const name = "fake registry-test"
	a, b := &fake{1}, &fake{2}
	t.Cleanup(func() { unregister(name, a); unregister(name, b) })

	register(t, config(t), name, name, a)
	if got := registered(name); got != a {
		t.Fatalf("registered %v, want a", got)
	}
	if reg, ok := RegistrationOf(a); !ok || reg.Name != name || reg.Module != "fake" || reg.Store != a {
		t.Fatalf("RegistrationOf(a) = %+v, %t", reg, ok)
	}
	// A reload: the new config's instance registers before the old one is
	// cleaned up, and the name stays until the last one goes.
	register(t, config(t), name, name, b)
	if got := registered(name); got != b {
		t.Fatalf("registered %v after the second registration, want b", got)
	}
	unregister(name, a)
	unregister(name, a) // twice is harmless
	if got := registered(name); got != b {
		t.Fatalf("registered %v after a's cleanup, want b", got)
	}
	if _, ok := RegistrationOf(a); ok {
		t.Fatal("a is still registered after its cleanup")
	}
	unregister(name, b)
	if got := registered(name); got != nil {
		t.Fatalf("registered %v after every cleanup, want none", got)
	}
	unregister("fake never", a) // unknown names are harmless
}

func TestRegisteredIsSorted(t *testing.T) {
	s := &fake{}
	for _, n := range []string{"fake b", "fake a", "fake c"} {
		register(t, nil, n, n, s)
	}
	var names []string
	for _, r := range Registered() {
		if r.Module == "fake" {
			names = append(names, r.Name)
		}
	}
	if len(names) != 3 || names[0] != "fake a" || names[1] != "fake b" || names[2] != "fake c" {
		t.Fatalf("Registered names %v, want sorted", names)
	}
}

// Within one config a name stands for one set of records, and one set of
// records has one name; stores that share both share the registration.
func TestRegisterNameCollisions(t *testing.T) {
	cfg := config(t)
	orders, payments, shared := &fake{1}, &fake{2}, &fake{3}
	register(t, cfg, "fake orders", "fake db 1", orders)
	register(t, cfg, "fake orders", "fake db 1", shared) // same records, same name: one store
	for _, tc := range []struct {
		name, records, want string
	}{
		{"fake orders", "fake db 2", "store name 'fake orders' is already given to other records in this config (fake db 1)"},
		{"fake payments", "fake db 1", "the records of fake db 1 are already named 'fake orders' in this config"},
	} {
		err := Register(cfg, Registration{Name: tc.name, Module: "fake", Store: payments}, tc.records)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Register(%q, %q) = %v, want an error containing %q", tc.name, tc.records, err, tc.want)
		}
		if _, ok := RegistrationOf(payments); ok {
			t.Errorf("Register(%q, %q) failed but registered the store", tc.name, tc.records)
		}
	}
	register(t, cfg, "fake payments", "fake db 2", payments)

	// The next config, during a reload, may move the name to other records.
	next := &fake{4}
	register(t, config(t), "fake orders", "fake db 3", next)
	if got := registered("fake orders"); got != next {
		t.Fatalf("registered %v under the moved name, want the new config's store", got)
	}
}

func TestRegisterRefusesUnreadableNames(t *testing.T) {
	for _, name := range []string{"", " orders", "orders ", "or\nders", "or\x00ders"} {
		if err := Register(nil, Registration{Name: name, Module: "fake", Store: &fake{}}, "fake"); err == nil || !strings.Contains(err.Error(), "want printable characters") {
			t.Errorf("Register(%q) = %v, want a refusal", name, err)
		}
	}
	register(t, nil, "orders (eu-west, db 2)", "fake db 2", &fake{})
}
