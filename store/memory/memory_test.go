package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestSharedAcrossReloads(t *testing.T) {
	a := storetest.Provision(t, &Memory{MaxEntries: 7})
	k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Lease: time.Minute}
	if rec, _ := a.Acquire(context.Background(), k, c); rec != nil {
		t.Fatal("claim failed")
	}
	// A reload provisions a new module before the old one is cleaned up.
	b := storetest.Provision(t, &Memory{MaxEntries: 7})
	a.Cleanup()
	a.Cleanup() // idempotent
	if rec, _ := b.Acquire(context.Background(), k, &store.Claim{Lease: time.Minute}); rec == nil || rec.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v", rec)
	}
}

// acquire claims a new key for a claim on endpoint, failing t if it cannot.
func acquire(t *testing.T, m *Memory, endpoint string) (store.Key, *store.Claim) {
	t.Helper()
	k := storetest.NewKey()
	c := &store.Claim{Token: storetest.NewToken(), Endpoint: endpoint, Fingerprint: store.Fingerprint{7}, Lease: time.Minute}
	if rec, err := m.Acquire(context.Background(), k, c); rec != nil || err != nil {
		t.Fatalf("Acquire = %v, %v", rec, err)
	}
	return k, c
}
