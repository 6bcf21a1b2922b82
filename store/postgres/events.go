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

// The statements that end a watched claim or purge a record (sql.go)
// notify the table's channel with store.AppendEvent payloads; one
// connection per pool listens (listener.go).

const channelSuffix = ":events"

// channelName is the table's channel, "<table>:events", at most
// maxIdentifier bytes (LISTEN truncates longer names, pg_notify refuses
// them): a longer name ends in a hash of the whole. The schema is left
// out, so that instances that name one table differently hear each other;
// same-named tables in two schemas share a channel, at the cost of
// needless wake-ups and evictions.
func channelName(table string) string {
	// pgx drops NUL from identifiers: drop it from both spellings alike.
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
// standard_conforming_strings.
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
// whichever instance ends it notifies the table's channel.
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
