package redis

import (
	"context"
	"encoding/hex"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The events that instances announce on their prefix's channel: one byte
// of kind, then the key's 64 hex digits.
//
// Announcing the end of every claim would cost Redis a delivery to every
// instance per new key. So a waiter that finds a claim in progress marks
// it watched (notifyScript, markKey); the completion and release scripts
// delete the mark in the same call and report it, and only then is the end
// announced: nobody waiting costs nothing but a DEL of a missing key
// inside the script. A purge is always announced, for the local tiers.
const (
	eventEnded  = 'e' // a claim someone waits for was completed or released
	eventPurged = 'p' // a record was deleted, whatever its state
	eventLen    = 1 + 2*len(store.Key{})
)

// notifyScript marks KEYS[1] watched for ARGV[2] milliseconds, unless
// another waiter's mark lasts longer, if its record is an in-progress
// claim (whose head is ARGV[1]); it returns 1 if it was, 0 if not. The
// check and the mark are one step, so a completion either comes after the
// mark and sees it, or before the check and is seen by it.
var notifyScript = goredis.NewScript(`
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) ~= ARGV[1] then return 0 end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[2], '', 'PX', ARGV[2])
end
return 1
`)

var inProgressHead = string(store.StatePrefix(store.InProgress))

// Notify implements store.Notifier: it marks key's claim watched for d, so
// that whichever instance completes or releases it announces the end, and
// this instance's subscriber wakes the waiters here.
func (s *Store) Notify(ctx context.Context, key store.Key, d time.Duration) (bool, error) {
	if !s.events.listening(s.channel) {
		return false, store.ErrNotListening
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := notifyScript.Run(ctx, s.client, []string{s.key(key), s.markKey(key)}, inProgressHead, millis(d)).Int64()
	if err != nil {
		return false, store.Unavailable("watching", err)
	}
	return n == 1, nil
}

// announce publishes an event about key. A lost announcement of an end
// costs the waiters elsewhere their fallback poll; the caller decides what
// a lost purge costs.
func (s *Store) announce(ctx context.Context, kind byte, key store.Key) error {
	var b [eventLen]byte
	b[0] = kind
	hex.Encode(b[1:], key[:])
	err := s.events.publish(ctx, s.channel, b[:])
	if err != nil && kind == eventEnded {
		s.logger.Warn("announcing the end of a claim failed; its waiters on other instances notice it at their next poll",
			zap.String("key_hash", key.String()), zap.Error(err))
	}
	return err
}

// parseEvent reads what announce sent.
func parseEvent(p string) (kind byte, key store.Key, ok bool) {
	if len(p) != eventLen || (p[0] != eventEnded && p[0] != eventPurged) {
		return 0, key, false
	}
	if _, err := hex.Decode(key[:], []byte(p[1:])); err != nil {
		return 0, key, false
	}
	return p[0], key, true
}

var _ store.Notifier = (*Store)(nil)
