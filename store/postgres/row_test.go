package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// An unknown outcome, a truncated response and a sealed one each have a
// column of their own, which the claim that takes over the expired row
// clears; it keeps the claim's creation time.
func TestResponseFlagColumns(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	tx := begin(t)
	type flags struct {
		status                     int
		truncated, unknown, sealed bool
	}
	columns := func(k store.Key) flags {
		t.Helper()
		var got flags
		err := tx.QueryRow(ctx, "SELECT status, truncated, outcome_unknown, sealed FROM "+s.db.qualified+" WHERE key = $1", k[:]).
			Scan(&got.status, &got.truncated, &got.unknown, &got.sealed)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	const ttl = 300 * time.Millisecond
	responses := []store.Response{{OutcomeUnknown: true}, {Status: 200, Truncated: true}, {Status: 201, Sealed: true}}
	keys := make([]store.Key, len(responses))
	for i, resp := range responses {
		k, c := storetest.NewKey(), claim(time.Minute)
		keys[i] = k
		if rec, err := recordOf(s.Acquire(ctx, k, c)); rec != nil || err != nil {
			t.Fatalf("Acquire = %+v, %v; want a claim", rec, err)
		}
		if err := s.Complete(ctx, k, c, &resp, ttl); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if got, want := columns(k), (flags{resp.Status, resp.Truncated, resp.OutcomeUnknown, resp.Sealed}); got != want {
			t.Fatalf("columns of %+v = %+v, want %+v", resp, got, want)
		}
		rec, _, err := s.Lookup(ctx, k)
		if err != nil || rec == nil || rec.Status != resp.Status || rec.Truncated != resp.Truncated ||
			rec.OutcomeUnknown != resp.OutcomeUnknown || rec.Sealed != resp.Sealed {
			t.Fatalf("Lookup of %+v = %+v, %v", resp, rec, err)
		}
	}
	time.Sleep(ttl + 100*time.Millisecond)
	for _, k := range keys {
		// The handler's time, not the database's.
		c := claim(time.Minute)
		c.CreatedAt = c.CreatedAt.Add(-time.Hour)
		if rec, err := recordOf(s.Acquire(ctx, k, c)); rec != nil || err != nil {
			t.Fatalf("Acquire after the TTL = %+v, %v; want a claim", rec, err)
		}
		if got := columns(k); got != (flags{}) {
			t.Fatalf("columns of the claim that reused the key = %+v, want none set", got)
		}
		if rec, _, err := s.Lookup(ctx, k); err != nil || rec == nil || rec.State != store.InProgress ||
			rec.Truncated || rec.OutcomeUnknown || rec.Sealed {
			t.Fatalf("Lookup of the claim that reused the key = %+v, %v", rec, err)
		} else if d := rec.CreatedAt.Sub(c.CreatedAt); d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("CreatedAt of the claim that reused the key = %v, want the claim's %v", rec.CreatedAt, c.CreatedAt)
		}
	}
}
