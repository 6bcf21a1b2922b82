package postgres

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// The statements of one key must find it through the primary key, in
// generic plans (pgx prepares each statement once per connection) and
// custom ones, never by walking the partial index of claims in flight or
// the reaper's index, whatever the statistics say of their ranges.
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
		"acquire":  {q.acquire, `'\x01', '\x02', 'POST /', '\x03', 1000, 1796000000000000, 60000000`},
		"takeover": {q.takeover, `'\x01', '\x02', 'POST /', '\x03', 1000, 1796000000000000, 60000000, true`},
		"complete": {q.complete, `'\x01', '\x02', 200, NULL, NULL, false, false, false, 1000`},
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
				strings.Contains(p, indexName(s.table, inFlightIndex)) || strings.Contains(p, indexName(s.table, reapIndex)) {
				t.Errorf("%s (%s) does not look the key up in the primary key alone:\n%s", name, mode, p)
			}
		}
	}
}
