package file

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func tryProvision(s *Store) error {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	return s.Provision(ctx)
}

func claim(lease time.Duration) *store.Claim {
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", CreatedAt: time.Now(), Lease: lease}
}

func TestUnavailableOnceClosed(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	s.Cleanup()
	storetest.CheckUnavailable(t, s)
}

func TestDefaultPath(t *testing.T) {
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	storetest.Provision(t, &Store{})
	if _, err := os.Stat(filepath.Join(data, "caddy", "idempotency", "idempotency.db")); err != nil {
		t.Fatalf("database not in Caddy's data directory: %v", err)
	}
}

// A reload provisions the new config while the old one holds the file: it
// must attach to the open database, not try bbolt's lock, which the old
// config's handle holds.
func TestSharedAcrossReloads(t *testing.T) {
	dir := t.TempDir()
	a := storetest.Provision(t, &Store{Path: dir})
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := a.Acquire(context.Background(), k, c); err != nil {
		t.Fatal(err)
	}
	b := storetest.Provision(t, &Store{Path: dir + "/./"})
	if a.file != b.file || b.db() == nil {
		t.Fatal("the same file got a second handle, or none open")
	}
	a.Cleanup()
	a.Cleanup() // idempotent
	if got, err := b.Acquire(context.Background(), k, claim(time.Minute)); err != nil || got.Record == nil || got.Record.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v, %v", got.Record, err)
	}
}

func TestProvisionErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tryProvision(&Store{Path: file}); err == nil || !strings.Contains(err.Error(), "creating directory") {
		t.Fatalf("Provision under a plain file = %v", err)
	}
	if err := (&Store{}).Validate(); err == nil {
		t.Fatal("Validate passed an unprovisioned store")
	}
}

// db is s's open database, for the tests that look inside it.
func (s *Store) db() *database { return s.file.db.Load() }
