package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestInspector(t *testing.T) {
	storetest.RunInspector(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Memory{}) })
}

// Every config's store block of one name shares its table, so they share
// the name, registered until the last of them is cleaned up; a reload may
// give the table other limits.
func TestRegistered(t *testing.T) {
	const name = "registered-4243"
	a := storetest.Provision(t, &Memory{Name: name, MaxEntries: 4243})
	if got := storetest.Registered(name); got != a {
		t.Fatalf("registered %v under %s, want the store", got, name)
	}
	b := storetest.Provision(t, &Memory{Name: name, MaxEntries: 9000, MaxBytes: defaultMaxBytes})
	if got := storetest.Registered(name); got != b {
		t.Fatalf("registered %v after a reload, want the new store", got)
	}
	a.Cleanup()
	if got := storetest.Registered(name); got != b {
		t.Fatalf("registered %v after the old config's cleanup, want the new store", got)
	}
	b.Cleanup()
	if got := storetest.Registered(name); got != nil {
		t.Fatalf("registered %v after every cleanup, want none", got)
	}
}

func TestInFlightOldestFirst(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxEntries: 4244})
	ctx := context.Background()
	base := time.Now()
	keys := make([]store.Key, 5)
	for i := range keys {
		// Claims made i minutes apart, the first the oldest.
		now = func() time.Time { return base.Add(time.Duration(i) * time.Minute) }
		keys[i] = storetest.NewKey()
		c := &store.Claim{Token: storetest.NewToken(), CreatedAt: now(), Lease: time.Hour}
		if got, err := m.Acquire(ctx, keys[i], c); got.Record != nil || err != nil {
			t.Fatal(got.Record, err)
		}
	}
	now = func() time.Time { return base.Add(10 * time.Minute) }
	t.Cleanup(func() { now = time.Now })
	got, err := m.InFlight(ctx, 7*time.Minute, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Claims 0 to 3 are at least 7 minutes old; the 2 oldest are listed.
	if len(got) != 2 || got[0].Key != keys[0] || got[1].Key != keys[1] {
		t.Fatalf("InFlight(7m, 2) = %v, want the 2 oldest claims", got)
	}
	if !got[0].ExpiresAt.Equal(base.Add(time.Hour)) {
		t.Fatalf("listed expiry %v, want %v", got[0].ExpiresAt, base.Add(time.Hour))
	}
}

// A store block without a name is the table "memory", whatever its
// limits; a given name replaces it.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		m    Memory
		want string
	}{
		{Memory{}, "memory"},
		{Memory{MaxEntries: 5000}, "memory"},
		{Memory{MaxBytes: 1 << 30}, "memory"},
		{Memory{MaxEntries: 4245, Name: "local cache"}, "local cache"},
	} {
		m := storetest.Provision(t, &tc.m)
		if got := storetest.Registered(tc.want); got != m {
			t.Errorf("%+v: registered %v under %q, want the store", tc.m, got, tc.want)
		}
		m.Cleanup()
	}
}
