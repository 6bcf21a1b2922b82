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

// channelName is the table's channel, "<table>:events", at most
// maxIdentifier bytes (LISTEN truncates longer names, pg_notify refuses
// them): a longer name ends in a hash of the whole. The schema is left
// out, so that instances that name one table differently hear each other;
// same-named tables in two schemas share a channel, at the cost of
// needless wake-ups and evictions.
func channelName(table string) string {
	// pgx drops NUL from identifiers: drop it from both spellings alike.
	name := strings.ReplaceAll(table+":events", "\x00", "")
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

func listenStatement(channel string) string {
	return "LISTEN " + pgx.Identifier{channel}.Sanitize()
}

// Notify implements store.Notifier: it marks key's claim watched, so that
// whichever instance ends it notifies the table's channel.
func (s *Store) Notify(ctx context.Context, key store.Key) (bool, error) {
	if !s.db.events.listening() {
		return false, store.ErrNotListening
	}
	return s.affected(ctx, "watching", s.db.q.watch, key[:])
}

var _ store.Notifier = (*Store)(nil)
