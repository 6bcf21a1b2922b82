package redis

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestContract(t *testing.T) {
	srv := testredis.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return open(t, srv) })
}

func TestUnavailableThenRecovers(t *testing.T) {
	srv := testredis.Start(t)
	s := storetest.Provision(t, failFast(&Store{Addresses: []string{srv.Addr()}}))
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
	if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire after the restart = %+v, %v; want a claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Response{Status: 204}, time.Minute); err != nil {
		t.Fatalf("Complete after the restart: %v", err)
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

func TestRoundTrips(t *testing.T) {
	srv := testredis.Start(t)
	s := open(t, srv)
	hook := &tripHook{}
	s.client.AddHook(hook)
	ctx := context.Background()

	// deadClaim is the key of a claim whose lease has passed.
	deadClaim := func() store.Key {
		k, c := storetest.NewKey(), claim()
		c.Lease = time.Millisecond
		s.Acquire(ctx, k, c)
		time.Sleep(5 * time.Millisecond)
		return k
	}
	// Warm up: load the scripts and open the connection.
	k, c := storetest.NewKey(), claim()
	s.Acquire(ctx, k, c)
	if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.Acquire(ctx, deadClaim(), claim())

	measure := func(name string, wantSent int64, want map[string]int64, f func()) {
		t.Helper()
		srv.ConfigResetStat(t)
		sent := hook.sent.Load()
		f()
		if got := hook.sent.Load() - sent; got != wantSent {
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
	// script reads no more than the claim's 69-byte head (the owner prefix,
	// and the flags that tell whether someone waits): the record it stores
	// comes whole from the handler. Nobody waits: nothing is published.
	measure("a first execution", 2, map[string]int64{"set": 2, "evalsha": 1, "getrange": 1}, func() {
		if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
			t.Fatalf("Acquire = %+v, %v", rec, err)
		}
		if err := s.Complete(ctx, k, c, &store.Response{Status: 201, Body: []byte("ok")}, time.Minute); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	})
	measure("a replay", 1, map[string]int64{"set": 1}, func() {
		if rec, err := acquireRecord(ctx, s, k, claim()); err != nil || rec == nil || rec.Status != 201 {
			t.Fatalf("replay Acquire = %+v, %v", rec, err)
		}
	})
	k2 := storetest.NewKey()
	s.Acquire(ctx, k2, claim())
	measure("a conflict", 1, map[string]int64{"set": 1}, func() {
		if rec, err := acquireRecord(ctx, s, k2, claim()); err != nil || rec == nil || rec.State != store.InProgress {
			t.Fatalf("conflicting Acquire = %+v, %v", rec, err)
		}
	})
	// The SET NX GET finds a dead owner's claim; the script that takes it
	// over reads it whole (GET: it is no larger than a claim), judges its
	// lease by Redis's clock (TIME) and writes.
	k3 := deadClaim()
	measure("a takeover", 2, map[string]int64{"set": 2, "evalsha": 1, "get": 1, "time": 1}, func() {
		if got, err := s.Acquire(ctx, k3, claim()); err != nil || got.Record != nil || !got.TookOver {
			t.Fatalf("Acquire of a dead claim = %+v, %v", got, err)
		}
	})
}

func TestCompleteKeepsClaimBinding(t *testing.T) {
	s := open(t, testredis.Start(t))
	// The record keeps the claim's time; its expiry is by the clock of
	// the completion.
	created := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	completedAt := created.Add(time.Second)
	now = func() time.Time { return completedAt }
	t.Cleanup(func() { now = time.Now })

	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	c.Endpoint = strings.Repeat("POST example.com/long/path/", 20) // a multi-byte length prefix
	c.CreatedAt = created
	s.Acquire(ctx, k, c)
	resp := &store.Response{Status: 409, Header: http.Header{"A": {"1"}}, Body: []byte{0, 1, 2}, Truncated: true}
	if err := s.Complete(ctx, k, c, resp, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := acquireRecord(ctx, s, k, claim())
	if err != nil {
		t.Fatal(err)
	}
	want := &store.Record{State: store.Completed, Token: c.Token, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint,
		CreatedAt: created, Response: *resp, ExpiresAt: completedAt.Add(time.Minute)}
	got.CreatedAt, got.ExpiresAt = got.CreatedAt.UTC(), got.ExpiresAt.UTC()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("completed record =\n%+v\nwant\n%+v", got, want)
	}
}

// A retried SET whose first attempt was applied finds its own claim.
func TestAcquireOwnClaimIsAClaim(t *testing.T) {
	s := open(t, testredis.Start(t))
	k, c := storetest.NewKey(), claim()
	for i := range 2 {
		if rec, err := acquireRecord(context.Background(), s, k, c); rec != nil || err != nil {
			t.Fatalf("Acquire #%d = %+v, %v; want a claim", i+1, rec, err)
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
	benchmarkReplay(b, open(b, testredis.Start(b)))
}

// A replay from the local tier: no round trip, a map lookup and a decode.
func BenchmarkReplayLocalCache(b *testing.B) {
	srv := testredis.Start(b)
	benchmarkReplay(b, live(b, storetest.Provision(b, &Store{Addresses: []string{srv.Addr()}, LocalCache: 64 << 20})))
}

func benchmarkReplay(b *testing.B, s *Store) {
	storetest.BenchmarkReplay(b, s, &store.Response{Status: 200, Body: []byte(strings.Repeat("x", 1024))})
}
