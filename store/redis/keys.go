package redis

import (
	"encoding/hex"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// key is <prefix>:{<hex key>}; the braces make the key its own Cluster hash
// tag, which every script relies on.
func (s *Store) key(k store.Key) string {
	var h [2 * len(store.Key{})]byte
	hex.Encode(h[:], k[:])
	var b strings.Builder
	b.Grow(len(s.prefix) + 3 + len(h))
	b.WriteString(s.prefix)
	b.WriteString(":{")
	b.Write(h[:])
	b.WriteByte('}')
	return b.String()
}

// eventsChannel is the Pub/Sub channel on which the stores of every
// instance that use the prefix announce the end of a waited-for claim and
// every purge. Its hash tag is the same for every prefix, so that on a
// Cluster the channels of all the prefixes a client serves live on one
// shard, as one sharded subscription requires.
func eventsChannel(prefix string) string { return prefix + ":{events}" }

// parseKey recovers the store key from a Redis key, <prefix>:{<hex>}.
func parseKey(k, prefix string) (store.Key, bool) {
	var key store.Key
	h, ok := strings.CutPrefix(k, prefix)
	if !ok {
		return key, false
	}
	h, ok = strings.CutSuffix(h, "}")
	if !ok || len(h) != 2*len(key) {
		return key, false
	}
	if _, err := hex.Decode(key[:], []byte(h)); err != nil {
		return key, false
	}
	return key, true
}

// globEscape quotes the characters that SCAN's MATCH pattern treats
// specially, so that the prefix matches itself only.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
