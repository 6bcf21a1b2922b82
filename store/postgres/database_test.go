package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// fill inserts expired rows and live ones straight into s's table.
func fill(t *testing.T, s *Store, expired, live int) {
	t.Helper()
	if err := s.db.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + s.db.qualified + ` (key, state, token, endpoint, fingerprint, expires_at)
		SELECT sha256(($1 || i)::bytea), 'completed', '\x00'::bytea, 'GET /', '\x00'::bytea, now() + $2::interval
		FROM generate_series(1, $3) AS i`
	sqlExec(t, shared.DSN(), insert, "expired", "-1 second", expired)
	sqlExec(t, shared.DSN(), insert, "live", "1 hour", live)
}

func TestReaperDeletesExpiredInBatches(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	fill(t, s, 35, 5)
	batches := 0
	n, err := s.db.reap(context.Background(), 10, func() { batches++ })
	if err != nil || n != 35 {
		t.Fatalf("reap = %d, %v; want 35 rows deleted", n, err)
	}
	if batches != 4 {
		t.Errorf("reap ran %d batches of 10 for 35 rows, want 4", batches)
	}
	if left := count(t, shared.DSN(), s.table); left != 5 {
		t.Fatalf("%d rows left, want the 5 live ones", left)
	}
	// The lock was given back: the next run finds nothing to do.
	if n, err := s.db.reap(context.Background(), 10, nil); n != 0 || err != nil {
		t.Fatalf("second reap = %d, %v", n, err)
	}
}

// Two stores on one table, as two Caddy instances would have: while one
// reaps, the other steps aside.
func TestReaperOneAtATime(t *testing.T) {
	table := newTable()
	a := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, MaxConns: 3})
	b := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, MaxConns: 4})
	if a.db == b.db {
		t.Fatal("the two stores share a pool; the test needs two")
	}
	fill(t, a, 50, 0)

	inBatch, proceed := make(chan struct{}), make(chan struct{})
	type result struct {
		n   int64
		err error
	}
	done := make(chan result)
	go func() {
		first := true
		n, err := a.db.reap(context.Background(), 10, func() {
			if first {
				first = false
				close(inBatch)
				<-proceed
			}
		})
		done <- result{n, err}
	}()
	<-inBatch
	if n, err := b.db.reap(context.Background(), 10, nil); !errors.Is(err, errReaperBusy) || n != 0 {
		t.Errorf("second reaper during the first's run = %d, %v; want errReaperBusy", n, err)
	}
	close(proceed)
	if r := <-done; r.err != nil || r.n != 50 {
		t.Fatalf("first reaper = %d, %v; want 50", r.n, r.err)
	}
	if n, err := b.db.reap(context.Background(), 10, nil); err != nil || n != 0 {
		t.Fatalf("second reaper after the first's run = %d, %v; want 0, nil", n, err)
	}
}

// A takeover and the reaper racing for one expired row: the new claim must
// survive.
func TestReaperSparesTakenOverRows(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	for range 20 {
		k, dead := storetest.NewKey(), claim(time.Millisecond)
		dead.TTL = time.Millisecond // reaped a millisecond after its lease
		if _, err := s.Acquire(ctx, k, dead); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Millisecond)
		fresh := claim(time.Minute)
		reaped := make(chan error)
		go func() {
			_, err := s.db.reap(ctx, 1000, nil)
			reaped <- err
		}()
		if rec, err := recordOf(s.Acquire(ctx, k, fresh)); rec != nil || err != nil {
			t.Fatalf("takeover = %+v, %v", rec, err)
		}
		if err := <-reaped; err != nil {
			t.Fatal(err)
		}
		if err := s.Renew(ctx, k, fresh.Token, time.Minute); err != nil {
			t.Fatalf("the new claim did not survive the reaper: %v", err)
		}
	}
}

// The background reaper runs on its own and stops with the last user.
func TestReaperRunsAndStops(t *testing.T) {
	defer func(d time.Duration) { reapInterval = d }(reapInterval)
	reapInterval = 20 * time.Millisecond
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	fill(t, s, 30, 3)
	for deadline := time.Now().Add(10 * time.Second); count(t, shared.DSN(), s.table) != 3; {
		if time.Now().After(deadline) {
			t.Fatal("the reaper did not delete the expired rows within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	db := s.db
	s.Cleanup()
	select {
	case <-db.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the reaper still runs after Cleanup")
	}
}

func TestCreateTableOff(t *testing.T) {
	off := false
	table := newTable()
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, CreateTable: &off})
	_, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "does not exist") ||
		!strings.Contains(err.Error(), "create_table") {
		t.Fatalf("Acquire on a missing table = %v, want ErrUnavailable naming the table and create_table", err)
	}
	// What a migration would run.
	sqlExec(t, shared.DSN(), DDL("", table))
	if rec, err := recordOf(s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))); rec != nil || err != nil {
		t.Fatalf("Acquire once the table exists = %+v, %v", rec, err)
	}
}

// Many instances starting at once all create the same table; none fails.
func TestCreateTableConcurrently(t *testing.T) {
	sqlExec(t, shared.DSN(), `CREATE SCHEMA IF NOT EXISTS "App"`)
	table := newTable()
	var wg sync.WaitGroup
	for i := range 8 {
		// A distinct max_conns gives each its own pool, as separate
		// processes would have.
		s := storetest.Provision(t, &Store{DSN: shared.DSN(), Schema: "App", Table: table, MaxConns: i + 1})
		wg.Go(func() {
			if _, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute)); err != nil {
				t.Errorf("Acquire: %v", err)
			}
		})
	}
	wg.Wait()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM "App".`+qualify("", table)).Scan(&n); err != nil || n != 8 {
		t.Fatalf("%d rows in the schema's table (%v), want 8", n, err)
	}
}

// A table dropped while the store runs is created again, with its indexes,
// when create_table is on: the call that finds it gone fails, without
// telling the operator to turn on what is on, and the calls after it work.
func TestDroppedTableIsCreatedAgain(t *testing.T) {
	table := newTable()
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table})
	ctx := context.Background()
	if rec, err := recordOf(s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v", rec, err)
	}
	sqlExec(t, shared.DSN(), "DROP TABLE "+s.db.qualified)
	_, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) || strings.Contains(err.Error(), "create_table") {
		t.Errorf("Acquire on the dropped table = %v, want ErrUnavailable without a hint to turn create_table on", err)
	}
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := recordOf(s.Acquire(ctx, k, c)); rec != nil || err != nil {
		t.Fatalf("Acquire after the dropped table's first error = %+v, %v; want a claim in the table created again", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Response{Status: 201}, time.Minute); err != nil {
		t.Fatalf("Complete in the table created again: %v", err)
	}
	if defs := indexesOf(t, table); len(defs) != 2 {
		t.Fatalf("the table created again has %d indexes besides its primary key, want 2: %q", len(defs), defs)
	}
}

// With create_table off, a dropped table is the operator's to create: the
// error says so, call after call.
func TestDroppedTableWithCreateTableOff(t *testing.T) {
	off, table := false, newTable()
	sqlExec(t, shared.DSN(), DDL("", table))
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, CreateTable: &off})
	ctx := context.Background()
	if rec, err := recordOf(s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v", rec, err)
	}
	sqlExec(t, shared.DSN(), "DROP TABLE "+s.db.qualified)
	for range 2 {
		_, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))
		if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "turn create_table on") {
			t.Fatalf("Acquire on the dropped table = %v, want ErrUnavailable with the hint to create it", err)
		}
	}
}

// The reaper finds its batch through its index, whose expression its
// statement must spell alike, even when nearly every row is live.
func TestReaperUsesItsIndex(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	fill(t, s, 10, 5000)
	sqlExec(t, shared.DSN(), "ANALYZE "+s.db.qualified)
	tx := begin(t)
	ctx := context.Background()
	rows, _ := tx.Query(ctx, "EXPLAIN "+strings.Replace(s.db.q.reap, "$1", "1000", 1), pgx.QueryExecModeSimpleProtocol)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); !strings.Contains(plan, indexName(s.table, reapIndex)) {
		t.Fatalf("the reaper does not use its index:\n%s", plan)
	}
}
