package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// DDL returns the statements, safe to run again, that create the table and
// its indexes for schema (empty for the search_path's) and table.
//
// state has no CHECK constraint: PostgreSQL compiles one on every statement
// that writes the table. endpoint is bytea: text refuses NUL and invalid
// UTF-8. reap_at is set for a claim only: the lease's end plus the claim's
// TTL, so that a dead owner's claim is kept for a retry within TTL to take
// it over; a completed record is reaped at its expires_at, and costs only
// a bit of the row's null bitmap for it. The reaper's index is on when a
// row may go (reapTime), so that it finds only rows it may delete, however
// many dead claims it must keep.
func DDL(schema, table string) string {
	return strings.NewReplacer(
		"{table}", qualify(schema, table),
		"{reap_idx}", pgx.Identifier{indexName(table, reapIndex)}.Sanitize(),
		"{in_progress_idx}", pgx.Identifier{indexName(table, inFlightIndex)}.Sanitize(),
	).Replace(`CREATE TABLE IF NOT EXISTS {table} (
	key             bytea       PRIMARY KEY,
	state           text        NOT NULL,
	token           bytea       NOT NULL,
	endpoint        bytea       NOT NULL,
	fingerprint     bytea       NOT NULL,
	status          integer     NOT NULL DEFAULT 0,
	headers         bytea,
	body            bytea,
	truncated       boolean     NOT NULL DEFAULT false,
	outcome_unknown boolean     NOT NULL DEFAULT false,
	sealed          boolean     NOT NULL DEFAULT false,
	created_at      timestamptz NOT NULL DEFAULT now(),
	expires_at      timestamptz NOT NULL,
	reap_at         timestamptz
);
CREATE INDEX IF NOT EXISTS {reap_idx} ON {table} ((` + reapTime + `));
CREATE INDEX IF NOT EXISTS {in_progress_idx} ON {table} (created_at) WHERE state = 'in_progress';
`)
}

// reapTime is when the reaper may delete a row, as its index has it.
const reapTime = `coalesce(reap_at, expires_at)`

// What the table's indexes serve, in their names: the reaper, and the
// claims in flight that the admin API lists.
const (
	reapIndex     = "reap_at"
	inFlightIndex = "in_progress"
)

// indexHashBytes is how much of the table name's hash an index name
// carries, and indexPrefix how much of the table's name: with the longest
// purpose, the name fills maxIdentifier.
const (
	indexHashBytes = 4
	indexPrefix    = maxIdentifier - len("_"+inFlightIndex+"_") - 2*indexHashBytes
)

// indexName names table's index for purpose: the start of the table's
// name, the purpose, and a hash of the whole name. PostgreSQL cuts names
// at 63 bytes, so that table + "_" + purpose would, for a long table,
// become the table's own name or the other index's, and CREATE INDEX IF
// NOT EXISTS would skip the index without a word.
func indexName(table, purpose string) string {
	table = strings.ReplaceAll(table, "\x00", "") // as pgx drops it from identifiers
	sum := sha256.Sum256([]byte(table))
	n := min(len(table), indexPrefix)
	for n < len(table) && !utf8.RuneStart(table[n]) { // no rune cut in two
		n--
	}
	return table[:n] + "_" + purpose + "_" + hex.EncodeToString(sum[:indexHashBytes])
}

// qualify quotes the table name, to be used exactly as written.
func qualify(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
