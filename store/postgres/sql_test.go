package postgres

import (
	"strings"
	"testing"
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
}
