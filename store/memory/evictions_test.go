package memory

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The completed records evicted before their ttl passed are counted, by
// store, in the config's registry: their retries run again. Expired ones
// are not: nobody would have been answered from them.
func TestEvictionsOfLiveRecordsCounted(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	m := &Memory{Name: "evictions test", MaxEntries: 2}
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	const family = "caddy_idempotency_store_evictions_total"
	if n, err := testutil.GatherAndCount(ctx.GetMetricsRegistry(), family); err != nil || n == 0 {
		t.Fatalf("%s in the config's registry: %d series, %v; want the store's, at 0", family, n, err)
	}
	counted := func() float64 { return testutil.ToFloat64(evictions.WithLabelValues("evictions test")) }
	start := counted()

	complete := func(ttl time.Duration) {
		t.Helper()
		k, c := acquire(t, m, "POST /orders")
		if err := m.Complete(context.Background(), k, c, &store.Response{Status: 201}, ttl); err != nil {
			t.Fatal(err)
		}
	}
	complete(time.Nanosecond) // expired at once
	complete(time.Hour)
	complete(time.Hour) // evicts the expired record
	if n := counted() - start; n != 0 {
		t.Fatalf("evicting an expired record counted %v", n)
	}
	complete(time.Hour) // evicts a live one
	if n := counted() - start; n != 1 {
		t.Fatalf("evicting a live record counted %v, want 1", n)
	}
}
