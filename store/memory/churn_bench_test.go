package memory

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// BenchmarkNewKeyFullTable is the memory store's steady state under new
// keys: a table at its default 100,000 records, where every claim evicts
// the oldest and every completion replaces its claim. An op is one claim
// and its completion.
func BenchmarkNewKeyFullTable(b *testing.B) {
	m := storetest.Provision(b, &Memory{MaxEntries: 100_000, MaxBytes: 1 << 30})
	ctx := context.Background()
	rec := &store.Record{Status: 201, Body: make([]byte, 200), Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/orders/0f8fad5b-d9cb-469f-a165-70867728950e"},
	}}
	keys := make([]store.Key, 200_000)
	for i := range keys {
		keys[i] = storetest.NewKey()
	}
	cycle := func(k store.Key) {
		c := &store.Claim{Token: storetest.NewToken(), Endpoint: "POST api.example.com/orders", Lease: time.Minute}
		if _, err := m.Acquire(ctx, k, c); err != nil {
			b.Fatal(err)
		}
		if err := m.Complete(ctx, k, c, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for _, k := range keys[:100_000] {
		cycle(k)
	}
	i := 100_000
	for b.Loop() {
		cycle(keys[i%len(keys)])
		i++
	}
	m.Cleanup()
	m.tab = nil
}
