package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// shared is the server of every test that does not kill it; each test uses
// tables of its own.
var shared *testpg.Server

func TestMain(m *testing.M) {
	var err error
	if shared, err = testpg.New(); err != nil {
		fmt.Fprintf(os.Stderr, "testpg: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	shared.Close()
	os.Exit(code)
}

var tables atomic.Int64

// newTable returns a table name no other test uses.
func newTable() string { return fmt.Sprintf("idem_%d", tables.Add(1)) }

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

// sqlExec runs statements on a connection of its own.
func sqlExec(t testing.TB, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t testing.TB, dsn, table string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+qualify("", table)).Scan(&n); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return n
}

func claim(lease time.Duration) *store.Claim {
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", Lease: lease}
}

func TestContract(t *testing.T) {
	open := func(t *testing.T) store.Store { return provision(t, &Store{DSN: shared.DSN(), Table: newTable()}) }
	storetest.Run(t, open)
	storetest.RunTakeover(t, open)
}

// Caddy must start while PostgreSQL is down, every call must fail fast with
// ErrUnavailable while it is, and the same store must work again, creating
// its table, once PostgreSQL is back; and again after a crash.
func TestUnavailableThenRecovers(t *testing.T) {
	srv := testpg.Start(t)
	srv.Kill()
	s := provision(t, &Store{DSN: srv.DSN(), Table: newTable()})
	storetest.CheckUnavailable(t, s)

	srv.Restart(t)
	ctx := context.Background()
	if rec, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute)); rec != nil || err != nil {
		t.Fatalf("Acquire once PostgreSQL is up = %+v, %v; want a claim", rec, err)
	}

	srv.Kill()
	start := time.Now()
	storetest.CheckUnavailable(t, s)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("four calls on a dead PostgreSQL took %v", took)
	}

	srv.Restart(t)
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := s.Acquire(ctx, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire after the restart = %+v, %v; want a claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Record{Status: 204}, time.Minute); err != nil {
		t.Fatalf("Complete after the restart: %v", err)
	}
}

func TestDeadlineIsRespected(t *testing.T) {
	s := provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	k := storetest.NewKey()
	// Hold the key's row lock so that a takeover has to wait for it.
	if _, err := s.Acquire(context.Background(), k, claim(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s.db.qualified+" WHERE key = $1 FOR UPDATE", k[:]); err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Acquire(short, k, claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire past its deadline = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Acquire took %v with a 200ms deadline", took)
	}
}

func TestCreateTableOff(t *testing.T) {
	off := false
	table := newTable()
	s := provision(t, &Store{DSN: shared.DSN(), Table: table, CreateTable: &off})
	_, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "does not exist") ||
		!strings.Contains(err.Error(), "create_table") {
		t.Fatalf("Acquire on a missing table = %v, want ErrUnavailable naming the table and create_table", err)
	}
	// What a migration would run.
	sqlExec(t, shared.DSN(), DDL("", table))
	if rec, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute)); rec != nil || err != nil {
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
		s := provision(t, &Store{DSN: shared.DSN(), Schema: "App", Table: table, MaxConns: i + 1})
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

func TestSharedAcrossReloads(t *testing.T) {
	table := newTable()
	a := provision(t, &Store{DSN: shared.DSN(), Table: table})
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := a.Acquire(context.Background(), k, c); rec != nil || err != nil {
		t.Fatalf("claim failed: %+v, %v", rec, err)
	}
	// A reload provisions the new config before cleaning up the old one.
	b := provision(t, &Store{DSN: shared.DSN(), Table: table})
	if a.db != b.db {
		t.Fatal("the same configuration got a second pool")
	}
	a.Cleanup()
	a.Cleanup() // idempotent
	rec, err := b.Acquire(context.Background(), k, claim(time.Minute))
	if err != nil || rec == nil || rec.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v, %v", rec, err)
	}
}

func TestProvisionErrors(t *testing.T) {
	for _, tc := range []struct {
		s       Store
		wantErr string
	}{
		{Store{}, "dsn is required"},
		{Store{DSN: "{env.TESTPG_SURELY_UNSET}"}, "dsn is required"},
		{Store{DSN: "postgres://u:secret@host:notaport/db"}, "parsing dsn"},
		{Store{DSN: "postgres://h/db", Table: strings.Repeat("t", 64)}, "longer than 63"},
		{Store{DSN: "postgres://h/db", MaxConns: -1}, "max_conns -1"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := tc.s.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Provision(%v) = %v, want an error containing %q", tc.s, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Provision error shows the password: %v", err)
		}
		tc.s.Cleanup()
	}
}

func TestStringRedactsPassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://app:s3cret@db:5432/app",
		"postgres://app@db/app?password=s3cret",
		"host=db user=app password=s3cret dbname=app",
		"host=db password='s3 cret' dbname=app",
		"postgres://app:s3{cret@db/app",
	} {
		s := Store{DSN: dsn}
		for _, out := range []string{s.String(), fmt.Sprintf("%v", s), fmt.Sprintf("%#v", s), fmt.Sprint(&s)} {
			if strings.Contains(out, "s3") {
				t.Errorf("%q printed as %s", dsn, out)
			}
		}
	}
}

func TestDDL(t *testing.T) {
	ddl := DDL("app", `odd"name`)
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."odd""name"`,
		`CREATE INDEX IF NOT EXISTS "odd""name_expires_at_idx" ON "app"."odd""name" (expires_at)`,
		"key         bytea       PRIMARY KEY",
	} {
		if !strings.Contains(ddl, want) {
			t.Errorf("DDL lacks %q:\n%s", want, ddl)
		}
	}
}

func BenchmarkAcquireNewKey(b *testing.B) {
	s := provision(b, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	c := claim(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if rec, err := s.Acquire(ctx, storetest.NewKey(), c); rec != nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", rec, err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := provision(b, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 4096)
	rec := &store.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}
	if err := s.Complete(ctx, k, c, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, err := s.Acquire(ctx, k, claim(time.Minute)); got == nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", got, err)
		}
	}
}

// With a connection per goroutine, the losers' statements start before the
// winner's commits and see no row in their snapshot: they must run again
// and find the claim, never report an error or a second win.
func TestClaimRaceManyConnections(t *testing.T) {
	s := provision(t, &Store{DSN: shared.DSN(), Table: newTable(), MaxConns: 32})
	for range 20 {
		k := storetest.NewKey()
		var wg sync.WaitGroup
		var winners atomic.Int32
		start := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				<-start
				rec, err := s.Acquire(context.Background(), k, claim(time.Minute))
				switch {
				case err != nil:
					t.Errorf("Acquire: %v", err)
				case rec == nil:
					winners.Add(1)
				case rec.State != store.InProgress:
					t.Errorf("loser saw %+v", rec)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := winners.Load(); n != 1 {
			t.Fatalf("%d winners, want 1", n)
		}
	}
}

// A claim that commits while Acquire's statement waits on it is invisible to
// that statement's snapshot: Acquire must run again and return it.
func TestAcquireRacingAnUncommittedClaim(t *testing.T) {
	s := provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	if err := s.db.ensure(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	k, other := storetest.NewKey(), storetest.NewToken()
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.db.qualified+` (key, state, token, endpoint, fingerprint, expires_at)
		VALUES ($1, 'in_progress', $2, 'POST /other', $3, now() + interval '1 minute')`, k[:], other[:], make([]byte, 32)); err != nil {
		t.Fatal(err)
	}

	type result struct {
		rec *store.Record
		err error
	}
	done := make(chan result)
	go func() {
		rec, err := s.Acquire(ctx, k, claim(time.Minute))
		done <- result{rec, err}
	}()
	// Wait until Acquire blocks on the uncommitted row, then commit it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var waiting int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Acquire never waited on the uncommitted claim")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.rec == nil || r.rec.Token != other || r.rec.Endpoint != "POST /other" {
		t.Fatalf("Acquire racing a committed claim = %+v, %v; want that claim", r.rec, r.err)
	}
}
