package postgres

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestInspector(t *testing.T) {
	storetest.RunInspector(t, func(t *testing.T) store.Store {
		return storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	})
}

func TestInspectorUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close() // nothing listens there now
	s := storetest.Provision(t, &Store{DSN: fmt.Sprintf("postgres://caddy@127.0.0.1:%d/db?connect_timeout=1", addr.Port), Table: newTable()})
	storetest.CheckInspectorUnavailable(t, s)
}

// The Inspector creates the table like every other call, so that looking
// before the first request is not an error.
func TestInspectorCreatesTable(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	rec, _, err := s.Lookup(context.Background(), storetest.NewKey())
	if rec != nil || err != nil {
		t.Fatalf("Lookup on a new table = %+v, %v", rec, err)
	}
}

func TestNames(t *testing.T) {
	table := newTable()
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, Schema: "public"})
	_, port, _ := net.SplitHostPort(shared.Addr())
	if !strings.HasPrefix(s.name, "postgres ") || !strings.HasSuffix(s.name, " public."+table) || !strings.Contains(s.name, ":"+port+"/") {
		t.Fatalf("name %q, want postgres <host>:%s/<database> public.%s", s.name, port, table)
	}
	found := false
	for _, r := range store.Registered() {
		found = found || (r.Name == s.name && r.Store == store.Store(s))
	}
	if !found {
		t.Fatalf("%s is not registered", s.name)
	}
	s.Cleanup()
	for _, r := range store.Registered() {
		if r.Name == s.name {
			t.Fatalf("%s is still registered after Cleanup", s.name)
		}
	}

	// No password in the name, whatever the DSN. (Nothing listens on
	// port 1, and with create_table off nothing tries to connect.)
	off := false
	secret := storetest.Provision(t, &Store{DSN: "postgres://alice:s3cret@127.0.0.1:1/app?sslmode=disable", Table: table, CreateTable: &off})
	if want := "postgres 127.0.0.1:1/app " + table; secret.name != want {
		t.Fatalf("name %q, want %q", secret.name, want)
	}
	withPath := storetest.Provision(t, &Store{DSN: "host=127.0.0.1 port=1 dbname=app password=s3cret search_path=tenant1", Table: table, CreateTable: &off})
	if want := "postgres 127.0.0.1:1/app tenant1." + table; withPath.name != want {
		t.Fatalf("name %q, want %q", withPath.name, want)
	}

	// A given name replaces the default one.
	named := storetest.Provision(t, &Store{Name: "orders", DSN: "postgres://alice:s3cret@127.0.0.1:1/app?sslmode=disable", Table: table, CreateTable: &off})
	if got := storetest.Registered("orders"); got != named {
		t.Fatalf("registered %v under orders, want the named store", got)
	}
}

// InFlight reads the oldest claims first.
func TestInFlightOldestFirst(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	keys := make([]store.Key, 4)
	for i := range keys {
		keys[i] = storetest.NewKey()
		if rec, err := recordOf(s.Acquire(ctx, keys[i], claim(time.Hour))); rec != nil || err != nil {
			t.Fatal(rec, err)
		}
		// Age the claim by i hours.
		sqlExec(t, shared.DSN(), "UPDATE "+s.db.qualified+" SET created_at = created_at - $2::int * interval '1 hour' WHERE key = $1", keys[i][:], i)
	}
	got, err := s.InFlight(ctx, 90*time.Minute, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != keys[3] || got[1].Key != keys[2] {
		t.Fatalf("InFlight(90m, 2) = %+v, want claims 3 and 2", got)
	}
}
