package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// open returns a store on srv whose keys no other test shares.
func open(t testing.TB, srv *testredis.Server) *Store {
	return storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "test:" + t.Name()})
}

// failFast gives s timeouts short enough for a test to wait on a dead
// server.
func failFast(s *Store) *Store {
	s.DialTimeout = caddy.Duration(200 * time.Millisecond)
	s.ReadTimeout = caddy.Duration(200 * time.Millisecond)
	s.WriteTimeout = caddy.Duration(200 * time.Millisecond)
	return s
}

func TestProvisionWithRedisDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now

	start := time.Now()
	s := storetest.Provision(t, &Store{Addresses: []string{addr}})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Provision with Redis down took %v, want about 1s at most", took)
	}
	if _, err := s.Acquire(context.Background(), storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire = %v, want ErrUnavailable", err)
	}
}

func TestPasswordPlaceholder(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "idem", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEM_TEST_REDIS_PASSWORD", "s3cret")
	s := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, Username: "idem", Password: "{env.IDEM_TEST_REDIS_PASSWORD}"})
	if s.opts.Password != "s3cret" || s.Password != "{env.IDEM_TEST_REDIS_PASSWORD}" {
		t.Fatalf("resolved password %q from %q", s.opts.Password, s.Password)
	}
	if _, err := s.Acquire(ctx, storetest.NewKey(), claim()); err != nil {
		t.Fatalf("Acquire as an ACL user: %v", err)
	}

	wrong := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, Username: "idem", Password: "nope"})
	if _, err := wrong.Acquire(ctx, storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with a wrong password = %v, want ErrUnavailable", err)
	}
}

func TestClientIsSharedAcrossReloads(t *testing.T) {
	srv := testredis.Start(t)
	cfg := func() *Store { return &Store{Addresses: []string{srv.Addr()}} }
	a, b := storetest.Provision(t, cfg()), storetest.Provision(t, cfg())
	if a.client != b.client {
		t.Fatal("two stores with the same configuration got different clients")
	}
	other := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, DB: 1})
	if other.client == a.client {
		t.Fatal("a different db shared the client")
	}

	client, ctx := a.client, context.Background()
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("client closed while still in use: %v", err)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(ctx).Err(); !errors.Is(err, goredis.ErrClosed) {
		t.Fatalf("Ping after the last Cleanup = %v, want ErrClosed", err)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if err := (*Store)(nil).Cleanup(); err != nil {
		t.Fatalf("Cleanup of nil: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		store *Store
		want  string
	}{
		{&Store{Addresses: []string{"localhost"}}, "address 'localhost'"},
		{&Store{Addresses: []string{"a:1", "b:1"}, DB: 2}, "db 2"},
		{&Store{DB: -1}, "db -1"},
		{&Store{PoolSize: -1}, "pool_size -1"},
		{&Store{LocalCache: -1}, "local_cache -1"},
		{&Store{ReadTimeout: -1}, "read_timeout"},
		{&Store{KeyPrefix: "a{b}"}, "key_prefix 'a{b}'"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := tc.store.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Provision(%v) = %v, want an error naming %q", tc.store, err, tc.want)
		}
	}
	// Sentinel: several addresses with a master may use any db.
	s := &Store{Addresses: []string{"a:1", "b:1"}, MasterName: "m", DB: 2}
	s.opts.Addrs, s.opts.MasterName = s.Addresses, s.MasterName
	if err := s.Validate(); err != nil {
		t.Errorf("Validate of a Sentinel config with db 2: %v", err)
	}
}

func TestPasswordIsRedacted(t *testing.T) {
	s := Store{Addresses: []string{"a:1"}, Password: "hunter2"}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{s, &s} {
			if out := fmt.Sprintf(f, v); strings.Contains(out, "hunter2") {
				t.Errorf("Sprintf(%q) printed the password: %s", f, out)
			}
		}
	}
}

func claim() *store.Claim {
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", CreatedAt: time.Now(), Lease: time.Minute}
}

// acquireRecord is s.Acquire's record: nil when c claimed k.
func acquireRecord(ctx context.Context, s store.Store, k store.Key, c *store.Claim) (*store.Record, error) {
	got, err := s.Acquire(ctx, k, c)
	return got.Record, err
}

// A reload that changes pool_size gives the new config a client of its
// own; the old one serves the old config's requests until they are done.
func TestClientReplacedByReload(t *testing.T) {
	srv := testredis.Start(t)
	cfg := func(pool int) *Store {
		return &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "test:" + t.Name(), PoolSize: pool}
	}
	old := storetest.Provision(t, cfg(16))
	replacement := storetest.Provision(t, cfg(17))
	if old.client == replacement.client {
		t.Fatal("another pool_size shared the client")
	}
	storetest.CheckReplacedByReload(t, old, replacement)
	if err := old.client.Ping(context.Background()).Err(); !errors.Is(err, goredis.ErrClosed) {
		t.Fatalf("Ping on the old client after its last hold = %v, want ErrClosed", err)
	}
}
