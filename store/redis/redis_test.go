package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// provision provisions s as Caddy would and cleans it up after the test.
func provision(t testing.TB, s *Store) *Store {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return s
}

// open returns a store on srv whose keys no other test shares.
func open(t testing.TB, srv *testredis.Server) *Store {
	return provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "test:" + t.Name()})
}

func TestContract(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv) })
}

func TestUnavailableThenRecovers(t *testing.T) {
	srv := testredis.Start(t)
	s := provision(t, &Store{
		Addresses:    []string{srv.Addr()},
		DialTimeout:  caddy.Duration(200 * time.Millisecond),
		ReadTimeout:  caddy.Duration(200 * time.Millisecond),
		WriteTimeout: caddy.Duration(200 * time.Millisecond),
	})
	ctx := context.Background()
	if _, err := s.Acquire(ctx, storetest.NewKey(), claim()); err != nil {
		t.Fatalf("Acquire before the kill: %v", err)
	}

	srv.Kill()
	start := time.Now()
	storetest.CheckUnavailable(t, s)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("four calls on a dead Redis took %v", took)
	}

	// The same store, with no help, works once Redis is back.
	srv.Restart(t)
	k, c := storetest.NewKey(), claim()
	if rec, err := s.Acquire(ctx, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire after the restart = %+v, %v; want a claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Record{Status: 204}, time.Minute); err != nil {
		t.Fatalf("Complete after the restart: %v", err)
	}
}

func TestProvisionWithRedisDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now

	start := time.Now()
	s := provision(t, &Store{Addresses: []string{addr}})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Provision with Redis down took %v, want about 1s at most", took)
	}
	if _, err := s.Acquire(context.Background(), storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire = %v, want ErrUnavailable", err)
	}
}

func TestCancelledContextIsUnavailable(t *testing.T) {
	s := open(t, testredis.Start(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Acquire(ctx, storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context = %v, want ErrUnavailable wrapping context.Canceled", err)
	}
}

// countHook counts what the client sends, one per round trip.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestRoundTrips(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	hook := &countHook{}
	s.client.AddHook(hook)
	ctx := context.Background()

	// Warm up: load the script and open the connection.
	k, c := storetest.NewKey(), claim()
	s.Acquire(ctx, k, c)
	if err := s.Complete(ctx, k, c, &store.Record{Status: 200}, time.Minute); err != nil {
		t.Fatal(err)
	}

	measure := func(name string, wantSent int64, want map[string]int64, f func()) {
		t.Helper()
		srv.ConfigResetStat(t)
		sent := hook.n.Load()
		f()
		if got := hook.n.Load() - sent; got != wantSent {
			t.Errorf("%s sent %d commands, want %d", name, got, wantSent)
		}
		got := srv.CommandStats(t)
		for _, admin := range []string{"config|resetstat", "info", "hello", "client|setinfo", "ping"} {
			delete(got, admin)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s ran %v on the server, want %v", name, got, want)
		}
	}

	k, c = storetest.NewKey(), claim()
	// Redis also counts the commands a script runs: the script's GETRANGE
	// and SET appear beside the EVALSHA, which is one round trip. The
	// script reads no more than the 18-byte owner prefix: the record it
	// stores comes whole from the handler.
	measure("a first execution", 2, map[string]int64{"set": 2, "evalsha": 1, "getrange": 1}, func() {
		if rec, err := s.Acquire(ctx, k, c); rec != nil || err != nil {
			t.Fatalf("Acquire = %+v, %v", rec, err)
		}
		if err := s.Complete(ctx, k, c, &store.Record{Status: 201, Body: []byte("ok")}, time.Minute); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	})
	measure("a replay", 1, map[string]int64{"set": 1}, func() {
		if rec, err := s.Acquire(ctx, k, claim()); err != nil || rec == nil || rec.Status != 201 {
			t.Fatalf("replay Acquire = %+v, %v", rec, err)
		}
	})
	k2 := storetest.NewKey()
	s.Acquire(ctx, k2, claim())
	measure("a conflict", 1, map[string]int64{"set": 1}, func() {
		if rec, err := s.Acquire(ctx, k2, claim()); err != nil || rec == nil || rec.State != store.InProgress {
			t.Fatalf("conflicting Acquire = %+v, %v", rec, err)
		}
	})
}

func TestCompleteKeepsClaimBinding(t *testing.T) {
	s := open(t, testredis.Start(t))
	created := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	now = func() time.Time { return created }
	t.Cleanup(func() { now = time.Now })

	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	c.Endpoint = strings.Repeat("POST example.com/long/path/", 20) // a multi-byte length prefix
	s.Acquire(ctx, k, c)
	rec := &store.Record{Status: 409, Header: http.Header{"A": {"1"}}, Body: []byte{0, 1, 2}, Truncated: true}
	if err := s.Complete(ctx, k, c, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, k, claim())
	if err != nil {
		t.Fatal(err)
	}
	want := &store.Record{State: store.Completed, Token: c.Token, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint,
		CreatedAt: created, Status: 409, Header: rec.Header, Body: rec.Body, Truncated: true}
	got.CreatedAt = got.CreatedAt.UTC()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("completed record =\n%+v\nwant\n%+v", got, want)
	}
}

// A retried SET whose first attempt was applied finds its own claim.
func TestAcquireOwnClaimIsAClaim(t *testing.T) {
	s := open(t, testredis.Start(t))
	k, c := storetest.NewKey(), claim()
	for i := range 2 {
		if rec, err := s.Acquire(context.Background(), k, c); rec != nil || err != nil {
			t.Fatalf("Acquire #%d = %+v, %v; want a claim", i+1, rec, err)
		}
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	srv := testredis.Start(t)
	s := provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "app"})
	k := storetest.NewKey()
	want := "app:{" + k.String() + "}"
	if got := s.key(k); got != want {
		t.Fatalf("key = %q, want %q", got, want)
	}
	s.Acquire(context.Background(), k, claim())
	if n, err := srv.Client().Exists(context.Background(), want).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v", want, n, err)
	}
}

func TestPasswordPlaceholder(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "idem", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEM_TEST_REDIS_PASSWORD", "s3cret")
	s := provision(t, &Store{Addresses: []string{srv.Addr()}, Username: "idem", Password: "{env.IDEM_TEST_REDIS_PASSWORD}"})
	if s.opts.Password != "s3cret" || s.Password != "{env.IDEM_TEST_REDIS_PASSWORD}" {
		t.Fatalf("resolved password %q from %q", s.opts.Password, s.Password)
	}
	if _, err := s.Acquire(ctx, storetest.NewKey(), claim()); err != nil {
		t.Fatalf("Acquire as an ACL user: %v", err)
	}

	wrong := provision(t, &Store{Addresses: []string{srv.Addr()}, Username: "idem", Password: "nope"})
	if _, err := wrong.Acquire(ctx, storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with a wrong password = %v, want ErrUnavailable", err)
	}
}

func TestClientIsSharedAcrossReloads(t *testing.T) {
	srv := testredis.Start(t)
	cfg := func() *Store { return &Store{Addresses: []string{srv.Addr()}} }
	a, b := provision(t, cfg()), provision(t, cfg())
	if a.client != b.client {
		t.Fatal("two stores with the same configuration got different clients")
	}
	other := provision(t, &Store{Addresses: []string{srv.Addr()}, DB: 1})
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

func TestMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, -time.Second: 1, time.Nanosecond: 1, time.Millisecond: 1,
		1500 * time.Microsecond: 2, time.Minute: 60000} {
		if got := millis(d); got != want {
			t.Errorf("millis(%v) = %d, want %d", d, got, want)
		}
	}
}

func claim() *store.Claim {
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", Lease: time.Minute}
}

func BenchmarkAcquireNewKey(b *testing.B) {
	s := open(b, testredis.Start(b))
	ctx, c := context.Background(), claim()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Acquire(ctx, storetest.NewKey(), c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := open(b, testredis.Start(b))
	ctx, k, c := context.Background(), storetest.NewKey(), claim()
	s.Acquire(ctx, k, c)
	body := []byte(strings.Repeat("x", 1024))
	if err := s.Complete(ctx, k, c, &store.Record{Status: 200, Body: body}, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if rec, err := s.Acquire(ctx, k, claim()); err != nil || rec == nil {
			b.Fatal(rec, err)
		}
	}
}
