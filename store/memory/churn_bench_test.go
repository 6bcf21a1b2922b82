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
	m, rec := fullTable(b)
	// twice the table's keys, so that each is long evicted when it comes round
	keys := make([]store.Key, 200_000)
	for i := range keys {
		keys[i] = storetest.NewKey()
	}
	i := 0
	for b.Loop() {
		claimAndComplete(b, m, keys[i%len(keys)], rec)
		i++
	}
	m.Cleanup()
	m.tab = nil
}

// fullTable is a memory store at its default 100,000 records, each the
// answer of a JSON API to a POST, and that answer.
func fullTable(b *testing.B) (*Memory, *store.Response) {
	m := storetest.Provision(b, &Memory{MaxEntries: 100_000, MaxBytes: 1 << 30})
	rec := &store.Response{Status: 201, Body: make([]byte, 200), Header: http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/orders/0f8fad5b-d9cb-469f-a165-70867728950e"},
		"X-Request-Id":  {"b5d4c1f0a2e3"},
		"Cache-Control": {"no-store"},
	}}
	for range 100_000 {
		claimAndComplete(b, m, storetest.NewKey(), rec)
	}
	return m, rec
}

// claimAndComplete runs k's request through m as the handler does: a claim,
// then the completion that stores rec for an hour.
func claimAndComplete(b *testing.B, m *Memory, k store.Key, rec *store.Response) {
	ctx := context.Background()
	c := &store.Claim{Token: storetest.NewToken(), Endpoint: "POST api.example.com/orders", CreatedAt: time.Now(), Lease: time.Minute}
	if _, err := m.Acquire(ctx, k, c); err != nil {
		b.Fatal(err)
	}
	if err := m.Complete(ctx, k, c, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
}
