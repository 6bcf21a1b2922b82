package postgres

import (
	"context"
	"encoding/hex"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The instances that share a table hear from each other on one channel
// named after the table (channelName), which every statement that ends a
// watched claim or purges a record notifies (sql.go), with the events of
// store.AppendEvent as payloads, and which one connection per pool
// listens to (listener.go).

// channelSuffix makes the channel's name tell what it carries.
const channelSuffix = ":events"

// channelName is the channel of the table: "<table>:events", at most
// maxIdentifier bytes, as PostgreSQL truncates longer names in LISTEN and
// refuses them in pg_notify; a longer name keeps its head and ends in a
// hash of the whole. The schema is left out on purpose: instances that
// name one table differently (with its schema, or through their
// search_path) must hear each other, or a tier would miss purges. Tables
// of one name in two schemas of a database share a channel: each wakes the
// other's waiters, which read their record again, and evicts records from
// the other's tiers, which read them again; nothing worse.
func channelName(table string) string {
	// PostgreSQL names cannot hold a NUL, which pgx drops from
	// identifiers: drop it from both spellings of the channel alike.
	name := strings.ReplaceAll(table+channelSuffix, "\x00", "")
	if len(name) <= maxIdentifier {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	sum := hex.EncodeToString(h.Sum(nil))
	head := name[:maxIdentifier-1-len(sum)]
	for !utf8.ValidString(head) {
		head = head[:len(head)-1]
	}
	return head + "~" + sum
}

// quoteLiteral quotes s as an SQL string literal, whatever the server's
// standard_conforming_strings: a backslash makes it an escape string.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		return "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

// listenStatement is the LISTEN of channel.
func listenStatement(channel string) string {
	return "LISTEN " + pgx.Identifier{channel}.Sanitize()
}

// Notify implements store.Notifier: it marks key's claim watched, so that
// whichever instance completes or releases it notifies the table's
// channel, and this instance's listener wakes the waiters here.
func (s *Store) Notify(ctx context.Context, key store.Key) (bool, error) {
	if !s.db.events.listening() {
		return false, store.ErrNotListening
	}
	ctx = s.db.deadlines.bound(ctx)
	if err := s.db.ensure(ctx); err != nil {
		return false, err
	}
	tag, err := s.db.pool.Exec(ctx, s.db.q.watch, key[:])
	if err != nil {
		return false, s.unavailable("watching", err)
	}
	return tag.RowsAffected() > 0, nil
}

var _ store.Notifier = (*Store)(nil)
