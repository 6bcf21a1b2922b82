package postgres

import (
	"context"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestDDL(t *testing.T) {
	ddl := DDL("app", `odd"name`)
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."odd""name"`,
		`CREATE INDEX IF NOT EXISTS "odd""name_reap_at_`,
		"key             bytea       PRIMARY KEY",
		"outcome_unknown boolean     NOT NULL DEFAULT false",
		"sealed          boolean     NOT NULL DEFAULT false",
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

// indexesOf returns the definitions of the indexes of table but its
// primary key's.
func indexesOf(t testing.TB, table string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1
		AND indexname <> (SELECT conname FROM pg_constraint WHERE conrelid = to_regclass($2) AND contype = 'p')
		ORDER BY indexdef`, table, qualify("", table))
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return defs
}

// Names of 62 and 63 bytes, PostgreSQL's longest, keep both indexes: their
// names neither collide nor truncate to the table's.
func TestIndexesOfLongTableNames(t *testing.T) {
	for _, n := range []int{62, 63} {
		table := newTable() + "_"
		table += strings.Repeat("x", n-len(table))
		t.Run(table, func(t *testing.T) {
			s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table})
			if err := s.db.ensure(context.Background()); err != nil {
				t.Fatal(err)
			}
			defs := indexesOf(t, table)
			if len(defs) != 2 {
				t.Fatalf("a table of %d bytes has %d indexes besides its primary key, want 2:\n%s", n, len(defs), strings.Join(defs, "\n"))
			}
			for _, purpose := range []string{reapIndex, inFlightIndex} {
				if name := indexName(table, purpose); len(name) > maxIdentifier || !strings.Contains(strings.Join(defs, "\n"), name) {
					t.Errorf("no index named %q (%d bytes) among\n%s", name, len(name), strings.Join(defs, "\n"))
				}
			}
		})
	}
}

// Index names fit PostgreSQL's limit, whole runes, and differ for tables
// that differ only past the part of their name that the index names keep.
func TestIndexNames(t *testing.T) {
	long := strings.Repeat("é", 31) // 62 bytes
	seen := map[string]string{}
	for _, table := range []string{"idempotency_keys", long, long[:60] + "a", long[:60] + "b", strings.Repeat("x", 63)} {
		for _, purpose := range []string{reapIndex, inFlightIndex} {
			name := indexName(table, purpose)
			if len(name) > maxIdentifier || !utf8.ValidString(name) || !strings.Contains(name, "_"+purpose+"_") {
				t.Errorf("indexName(%q, %q) = %q, %d bytes", table, purpose, name, len(name))
			}
			if other, ok := seen[name]; ok {
				t.Errorf("%s and %s/%s share the index name %q", other, table, purpose, name)
			}
			seen[name] = table + "/" + purpose
		}
	}
}

// The operator's guide shows the DDL that create_table runs, index names
// included.
func TestDocumentedDDL(t *testing.T) {
	doc, err := os.ReadFile("../../docs/stores/postgres.md")
	if err != nil {
		t.Fatal(err)
	}
	if ddl := DDL("", defaultTable); !strings.Contains(string(doc), "```sql\n"+ddl+"```") {
		t.Errorf("docs/stores/postgres.md does not show the DDL of the default table:\n%s", ddl)
	}
}
