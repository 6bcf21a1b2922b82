package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A table created by hand from the DDL, with create_table off, as earlier
// versions documented it, holds an unknown outcome in the columns it has:
// truncated, status 0.
func TestOutcomeUnknownInExistingColumns(t *testing.T) {
	off := false
	table := newTable()
	sqlExec(t, shared.DSN(), DDL("", table))
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, CreateTable: &off})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := s.Acquire(ctx, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v; want a claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Record{OutcomeUnknown: true}, time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}

	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer conn.Close(ctx)
	var (
		state     string
		status    int
		truncated bool
	)
	err = conn.QueryRow(ctx, "SELECT state, status, truncated FROM "+qualify("", table)+" WHERE key = $1", k[:]).
		Scan(&state, &status, &truncated)
	if err != nil || state != "completed" || status != 0 || !truncated {
		t.Fatalf("row = %s, status %d, truncated %t, %v; want completed, 0, true", state, status, truncated, err)
	}

	rec, _, err := s.Lookup(ctx, k)
	if err != nil || rec == nil || !rec.OutcomeUnknown || rec.Truncated {
		t.Fatalf("Lookup = %+v, %v; want the unknown outcome", rec, err)
	}
}
