package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
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

// begin opens a transaction on a connection of its own to the shared
// server, rolled back and closed when the test ends.
func begin(t testing.TB) pgx.Tx {
	t.Helper()
	return beginOn(t, shared.DSN())
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
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", CreatedAt: time.Now(), Lease: lease}
}

// recordOf is the record of Acquire's result.
func recordOf(got store.Acquired, err error) (*store.Record, error) { return got.Record, err }

func TestSharedAcrossReloads(t *testing.T) {
	table := newTable()
	a := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table})
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := recordOf(a.Acquire(context.Background(), k, c)); rec != nil || err != nil {
		t.Fatalf("claim failed: %+v, %v", rec, err)
	}
	// A reload provisions the new config before cleaning up the old one.
	b := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table})
	if a.db != b.db {
		t.Fatal("the same configuration got a second pool")
	}
	a.Cleanup()
	a.Cleanup() // idempotent
	rec, err := recordOf(b.Acquire(context.Background(), k, claim(time.Minute)))
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
		{Store{DSN: "postgres://h/db", LocalCache: -1}, "local_cache -1"},
		{Store{DSN: "postgres://h/db", SynchronousCommit: "always"}, "synchronous_commit 'always' is not one of on, off, local, remote_write, remote_apply"},
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

// A reload that changes max_conns gives the new config a pool of its own;
// the old one serves the old config's requests until they are done.
func TestPoolReplacedByReload(t *testing.T) {
	table := newTable()
	old := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, MaxConns: 16})
	replacement := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, MaxConns: 17})
	if old.db == replacement.db {
		t.Fatal("another max_conns shared the pool")
	}
	storetest.CheckReplacedByReload(t, old, replacement)
}

// A DSN that does not parse is reported without its password, however the
// password is written: pgx's own redaction misses some spellings.
func TestParseErrorHidesPassword(t *testing.T) {
	for _, dsn := range []string{
		"host=127.0.0.1 port=notaport user=u password = s3cret dbname=db",
		"host=127.0.0.1 port=notaport user=u password= s3cret dbname=db",
		"host=127.0.0.1 port=notaport user=u password ='s3 cret' dbname=db",
		"host=127.0.0.1 port=notaport user=u password='s3cret' dbname=db",
		"postgres://u:s3cret@127.0.0.1:notaport/db",
		"postgres://u:s3\"cret@127.0.0.1:notaport/db",
		"postgres://u@127.0.0.1:notaport/db?password=s3cret",
		"postgres://u:s3cret@127.0.0.1/db?connect_timeout=never",
		"host=127.0.0.1 user=u password = s3cret connect_timeout=never",
		"host=127.0.0.1 user=u password='s3cret",
		"host=127.0.0.1 user=u password = s3cret pool_max_conns=s3cret",
		"host=127.0.0.1 port=notaport sslpassword = s3cret",
		"postgres://u:s3/cret@127.0.0.1:notaport/db",
		"postgres://u:s3cret@127.0.0.1/db?pool_max_conns=s3cret",
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		s := &Store{DSN: dsn}
		err := s.Provision(ctx)
		cancel()
		s.Cleanup()
		if err == nil || !strings.Contains(err.Error(), "parsing dsn") {
			t.Errorf("Provision(%q) = %v, want a parse error", dsn, err)
			continue
		}
		for _, out := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
			if strings.Contains(out, "s3") || strings.Contains(out, "cret") {
				t.Errorf("Provision(%q) error shows the password: %s", dsn, out)
			}
		}
	}
}
