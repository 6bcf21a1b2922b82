package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

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
	// A CHECK is compiled again on every write.
	if strings.Contains(ddl, "CHECK") {
		t.Errorf("DDL has a CHECK constraint:\n%s", ddl)
	}
}

// The statements of one key must find it through the primary key, in
// generic plans (pgx prepares each statement once per connection) and
// custom ones, never by walking the partial index of claims in flight or
// the expires_at index, whatever the statistics say of their ranges.
func TestKeyStatementsUseThePrimaryKey(t *testing.T) {
	for _, stats := range []struct {
		name string
		// live and expired rows when ANALYZE runs
		live, expired int
	}{
		// No claim in flight and nothing expired, as when ANALYZE ran
		// between bursts: both indexes' ranges look empty.
		{"all live", 5000, 0},
		// Everything expired: the range of live rows looks empty.
		{"all expired", 0, 5000},
	} {
		t.Run(stats.name, func(t *testing.T) {
			s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
			fill(t, s, stats.expired, stats.live)
			sqlExec(t, shared.DSN(), `ANALYZE `+s.db.qualified+`;
				INSERT INTO `+s.db.qualified+` (key, state, token, endpoint, fingerprint, expires_at)
				SELECT sha256(('claim' || i)::bytea), 'in_progress', '\x00'::bytea, 'GET /', '\x00'::bytea, now() + interval '1 minute'
				FROM generate_series(1, 100) AS i`)
			checkPlans(t, s)
		})
	}
}

func checkPlans(t *testing.T, s *Store) {
	ctx := context.Background()
	tx := begin(t)
	q := s.db.q
	for name, st := range map[string]struct{ sql, args string }{
		"acquire":  {q.acquire, `'\x01', '\x02', 'POST /', '\x03', 1000`},
		"takeover": {q.takeover, `'\x01', '\x02', 'POST /', '\x03', 1000`},
		"complete": {q.complete, `'\x01', '\x02', 200, NULL, NULL, false, 1000`},
		"release":  {q.release, `'\x01', '\x02'`},
		"renew":    {q.renew, `'\x01', '\x02', 1000`},
		"watch":    {q.watch, `'\x01'`},
		"lookup":   {q.lookup, `'\x01'`},
		"delete":   {q.delete, `'\x01'`},
	} {
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+st.sql); err != nil {
			t.Fatalf("preparing %s: %v", name, err)
		}
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			var plan strings.Builder
			rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+"("+st.args+")", pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatalf("explaining %s: %v", name, err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan.WriteString(line + "\n")
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("explaining %s: %v", name, err)
			}
			if p := plan.String(); !strings.Contains(p, "_pkey") ||
				strings.Contains(p, "_in_progress_idx") || strings.Contains(p, "_expires_at_idx") {
				t.Errorf("%s (%s) does not look the key up in the primary key alone:\n%s", name, mode, p)
			}
		}
	}
}

// earlierDDL is the table as versions before this one made it, with a CHECK
// on state, and as migrations made from their DDL still have it.
const earlierDDL = `CREATE TABLE %[1]s (
	key         bytea       PRIMARY KEY,
	state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
	token       bytea       NOT NULL,
	endpoint    text        NOT NULL,
	fingerprint bytea       NOT NULL,
	status      integer     NOT NULL DEFAULT 0,
	headers     jsonb,
	body        bytea,
	truncated   boolean     NOT NULL DEFAULT false,
	created_at  timestamptz NOT NULL DEFAULT now(),
	expires_at  timestamptz NOT NULL
);
CREATE INDEX %[2]s ON %[1]s (expires_at);
CREATE INDEX %[3]s ON %[1]s (created_at) WHERE state = 'in_progress';
`

// A table made by earlier versions, with their rows in it (headers written
// by encoding/json), is refused with the statement that converts its text
// endpoint and jsonb headers to bytea; once converted it works on, rows
// included, with create_table on or off, waking waiters across instances
// too.
func TestTableOfEarlierVersions(t *testing.T) {
	for _, create := range []bool{true, false} {
		t.Run(fmt.Sprintf("create_table %t", create), func(t *testing.T) {
			table := newTable()
			sqlExec(t, shared.DSN(), fmt.Sprintf(earlierDDL, qualify("", table),
				qualify("", table+"_expires_at_idx"), qualify("", table+"_in_progress_idx")))
			s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, CreateTable: &create})
			header := http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}
			headerJSON, _ := json.Marshal(header)
			before := storetest.NewKey()
			sqlExec(t, shared.DSN(), `INSERT INTO `+s.db.qualified+` (key, state, token, endpoint, fingerprint, status, headers, body, expires_at)
				VALUES ($1, 'completed', $2, 'POST /ordérs', $3, 201, $4, 'x', now() + interval '1 hour')`,
				before[:], make([]byte, 16), make([]byte, 32), headerJSON)

			_, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))
			migrate := byteaMigration(s.db.qualified)
			if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), migrate) {
				t.Fatalf("Acquire on an earlier table = %v, want ErrUnavailable naming %s", err, migrate)
			}
			sqlExec(t, shared.DSN(), migrate)
			rec, err := s.Acquire(context.Background(), before, claim(time.Minute))
			if err != nil || rec == nil || rec.Endpoint != "POST /ordérs" || !reflect.DeepEqual(rec.Header, header) {
				t.Fatalf("replay of a row converted to bytea = %+v, %v", rec, err)
			}
			testEarlierRows(t, s)
		})
	}
}

func testEarlierRows(t *testing.T, s *Store) {
	ctx := context.Background()
	header := http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}
	headerJSON, _ := json.Marshal(header)
	var done, running, releasing, dead, old store.Key
	for _, k := range []*store.Key{&done, &running, &releasing, &dead, &old} {
		*k = storetest.NewKey()
	}
	token, fp := storetest.NewToken(), store.Fingerprint{1, 2, 3}
	insert := `INSERT INTO ` + s.db.qualified + ` (key, state, token, endpoint, fingerprint, status, headers, body, expires_at)
		VALUES ($1, $2, $3, 'POST /orders', $4, $5, $6, $7, now() + $8::interval)`
	for _, r := range []struct {
		key     store.Key
		state   string
		status  int
		headers []byte
		body    []byte
		expires string
	}{
		{done, "completed", 201, headerJSON, []byte(`{"id":1}`), "1 hour"},
		{running, "in_progress", 0, nil, nil, "1 minute"},
		{releasing, "in_progress", 0, nil, nil, "1 minute"},
		{dead, "in_progress", 0, nil, nil, "-1 second"},
		{old, "completed", 200, nil, nil, "-1 second"},
	} {
		sqlExec(t, shared.DSN(), insert, r.key[:], r.state, token[:], fp[:], r.status, r.headers, r.body, r.expires)
	}
	claimOf := func() *store.Claim {
		return &store.Claim{Token: token, Endpoint: "POST /orders", Fingerprint: fp, Lease: time.Minute}
	}

	rec, err := s.Acquire(ctx, done, claim(time.Minute))
	if err != nil || rec == nil || rec.State != store.Completed || rec.Status != 201 ||
		!reflect.DeepEqual(rec.Header, header) || string(rec.Body) != `{"id":1}` || rec.Token != token || rec.Fingerprint != fp {
		t.Fatalf("replay of an earlier completed row = %+v, %v", rec, err)
	}
	// A waiter marks an earlier claim as it marks any, and its completion
	// notifies.
	conn := listen(t, s)
	if !storetest.Notify(t, s, running) {
		t.Fatal("Notify found the earlier claim not in progress")
	}
	if err := s.Complete(ctx, running, claimOf(), &store.Record{Status: 202, Header: header, Body: []byte("ok")}, time.Hour); err != nil {
		t.Fatalf("completing an earlier claim: %v", err)
	}
	if got := received(t, conn, 300*time.Millisecond); len(got) != 1 || got[0] != string(store.AppendEvent(nil, store.EventEnded, running)) {
		t.Fatalf("completing a watched earlier claim notified %q", got)
	}
	if rec, err := s.Acquire(ctx, running, claim(time.Minute)); err != nil || rec == nil || rec.State != store.Completed ||
		rec.Status != 202 || !reflect.DeepEqual(rec.Header, header) || string(rec.Body) != "ok" {
		t.Fatalf("replay after completing an earlier claim = %+v, %v", rec, err)
	}
	if err := s.Renew(ctx, releasing, token, time.Minute); err != nil {
		t.Fatalf("renewing an earlier claim: %v", err)
	}
	entries, err := s.InFlight(ctx, 0, 10)
	if err != nil || len(entries) != 1 || entries[0].Key != releasing {
		t.Fatalf("InFlight = %+v, %v; want the one earlier claim still in flight", entries, err)
	}
	if err := s.Release(ctx, releasing, token); err != nil {
		t.Fatalf("releasing an earlier claim: %v", err)
	}
	c := claim(time.Minute)
	if rec, err := s.Acquire(ctx, dead, c); rec != nil || err != nil || !c.TookOver {
		t.Fatalf("Acquire of an earlier claim whose lease passed = %+v, %v, TookOver %v; want a takeover", rec, err, c.TookOver)
	}
	c = claim(time.Minute)
	if rec, err := s.Acquire(ctx, old, c); rec != nil || err != nil || c.TookOver {
		t.Fatalf("Acquire of an earlier record past its TTL = %+v, %v, TookOver %v; want a fresh claim", rec, err, c.TookOver)
	}
	if rec, _, err := s.Lookup(ctx, done); err != nil || rec == nil || !reflect.DeepEqual(rec.Header, header) {
		t.Fatalf("Lookup of an earlier row = %+v, %v", rec, err)
	}
	// The optional step the README gives, under the name it gives.
	sqlExec(t, shared.DSN(), `ALTER TABLE `+s.db.qualified+` DROP CONSTRAINT `+qualify("", s.table+"_state_check"))
	if rec, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute)); rec != nil || err != nil {
		t.Fatalf("Acquire once the CHECK is dropped = %+v, %v", rec, err)
	}
}
