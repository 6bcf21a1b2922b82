package redis

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestInspector(t *testing.T) {
	srv := testredis.Start(t)
	storetest.RunInspector(t, func(t *testing.T) store.Store { return open(t, srv) })
}

func TestInspectorUnavailable(t *testing.T) {
	srv := testredis.Start(t)
	s := storetest.Provision(t, failFast(&Store{Addresses: []string{srv.Addr()}}))
	srv.Kill()
	storetest.CheckInspectorUnavailable(t, s)
}

// InFlight walks many SCAN batches, escapes the prefix in its pattern,
// skips what it did not write, and reads claims too long for one peek.
func TestInFlightScan(t *testing.T) {
	srv := testredis.Start(t)
	s := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "te*st[x]"})
	// Unescaped, the pattern te*st[x]:{*} would match this store's keys.
	neighbour := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "teXstx"})
	ctx := context.Background()
	rdb := srv.Client()

	// Completed records, some with bodies longer than a peek, written in
	// one pipeline: three SCAN batches' worth.
	p := rdb.Pipeline()
	body := []byte(strings.Repeat("b", 3*peekLen))
	for i := range 2500 {
		rec := &store.Record{State: store.Completed, CreatedAt: time.Now().Add(-time.Hour), Endpoint: "POST example.com/done",
			Response: store.Response{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}}}}
		if i%10 == 0 {
			rec.Body = body
		}
		p.Set(ctx, s.key(storetest.NewKey()), store.AppendRecord(nil, rec), time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	want := map[store.Key]string{}
	for i := range 3 {
		k, c := storetest.NewKey(), claim()
		if i == 0 {
			c.Endpoint = "POST example.com/" + strings.Repeat("x", 2*peekLen)
		}
		if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
			t.Fatal(rec, err)
		}
		want[k] = c.Endpoint
	}
	// A claim whose key has no expiry, as someone may have restored by
	// hand: listed with the lease end in its head. Without a lease end, a
	// claim is dead: no version of the store writes one.
	forever, fc := storetest.NewKey(), claim()
	rdb.Set(ctx, s.key(forever), appendClaim(nil, fc), 0)
	want[forever] = fc.Endpoint
	rdb.Set(ctx, s.key(storetest.NewKey()), store.AppendClaim(nil, claim()), 0)
	// Keys of the pattern that are not records of this store.
	rdb.Set(ctx, "te*st[x]:{not-hex}", "x", 0)
	rdb.HSet(ctx, s.key(storetest.NewKey()), "field", "value")
	rdb.Set(ctx, s.key(storetest.NewKey()), "garbage that is not a record", 0)
	if _, err := neighbour.Acquire(ctx, storetest.NewKey(), claim()); err != nil {
		t.Fatal(err)
	}

	got, err := s.InFlight(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("InFlight listed %d claims, want %d: %+v", len(got), len(want), got)
	}
	for _, e := range got {
		endpoint, ok := want[e.Key]
		if !ok || e.Endpoint != endpoint {
			t.Fatalf("InFlight listed %x with endpoint of %d bytes, not one of the claims", e.Key, len(e.Endpoint))
		}
		if left := time.Until(e.ExpiresAt); left <= 0 || left > time.Minute {
			t.Fatalf("claim %x expires at %v, want its lease end, within a minute", e.Key, e.ExpiresAt)
		}
	}
	if got, err := s.InFlight(ctx, 0, 2); err != nil || len(got) != 2 {
		t.Fatalf("InFlight(0, 2) = %d claims, %v; want 2", len(got), err)
	}
	if got, err := s.InFlight(ctx, time.Hour, 1000); err != nil || len(got) != 0 {
		t.Fatalf("InFlight(1h) = %+v, %v; want none", got, err)
	}
}

func TestNames(t *testing.T) {
	srv := testredis.Start(t)
	s := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, Password: "hunter2", DB: 3})
	want := "redis " + srv.Addr() + " db 3 prefix idempotency"
	if s.name != want {
		t.Fatalf("name %q, want %q", s.name, want)
	}
	found := false
	for _, r := range store.Registered() {
		if strings.Contains(r.Name, "hunter2") {
			t.Fatalf("registered name %q holds the password", r.Name)
		}
		found = found || (r.Name == want && r.Store == store.Store(s))
	}
	if !found {
		t.Fatalf("%s is not registered", want)
	}
	s.Cleanup()
	for _, r := range store.Registered() {
		if r.Name == want {
			t.Fatalf("%s is still registered after Cleanup", want)
		}
	}

	sentinel := &Store{opts: goredis.UniversalOptions{Addrs: []string{"s2:26379", "s1:26379"}, MasterName: "mymaster", DB: 2}, prefix: "app"}
	if got, want := sentinel.defaultName(), "redis mymaster (sentinels s1:26379,s2:26379) db 2 prefix app"; got != want {
		t.Fatalf("Sentinel name %q, want %q", got, want)
	}
	cluster := &Store{opts: goredis.UniversalOptions{Addrs: []string{"c2:7001", "c1:7000"}}, prefix: "idempotency"}
	if got, want := cluster.defaultName(), "redis cluster c1:7000,c2:7001 prefix idempotency"; got != want {
		t.Fatalf("Cluster name %q, want %q", got, want)
	}

	// A given name replaces the default one.
	named := storetest.Provision(t, &Store{Name: "orders", Addresses: []string{srv.Addr()}, DB: 3})
	if got := storetest.Registered("orders"); got != named {
		t.Fatalf("registered %v under orders, want the named store", got)
	}
}
