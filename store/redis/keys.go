package redis

import (
	"encoding/hex"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// key is <prefix>:{<hex key>}, its own Cluster hash tag, as every script needs.
func (s *Store) key(k store.Key) string {
	var h [2 * len(store.Key{})]byte
	hex.Encode(h[:], k[:])
	return s.prefix + ":{" + string(h[:]) + "}"
}

// eventsChannel is the prefix's Pub/Sub channel; its hash tag is the same
// for all prefixes, so that one sharded subscription can hold them all.
func eventsChannel(prefix string) string { return prefix + ":{events}" }

// parseKey recovers the store key from a Redis key, <prefix>:{<hex>}.
func parseKey(k, prefix string) (store.Key, bool) {
	var key store.Key
	h, prefixed := strings.CutPrefix(k, prefix)
	h, closed := strings.CutSuffix(h, "}")
	if !prefixed || !closed || len(h) != 2*len(key) {
		return key, false
	}
	if _, err := hex.Decode(key[:], []byte(h)); err != nil {
		return key, false
	}
	return key, true
}

// globEscape quotes SCAN MATCH's special characters, for s to match itself only.
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
