package redis

import (
	"context"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Only watched claims' ends are announced, and every purge: announcing every
// end would cost a delivery to every instance per key. notifyScript marks
// the in-progress claim KEYS[1] (head ARGV[1]) watched in place, keeping its
// expiry, and answers 1, or 0 if not in progress: in one step, so that a
// completion sees the flag or is seen by the check.
var notifyScript = codecScript(endsClaim + `
local head = redis.call('GETRANGE', KEYS[1], 0, {flags_offset})
if string.sub(head, 1, #ARGV[1]) ~= ARGV[1] or #head ~= {flags_offset} + 1 then return 0 end
local flags = string.byte(head, #head)
if bit.band(flags, {watched}) == 0 then
	redis.call('SETRANGE', KEYS[1], {flags_offset}, string.char(bit.bor(flags, {watched})))
end
return 1
`)

var inProgressHead = string(store.StatePrefix(store.InProgress))

// Notify marks key's claim watched, so that whoever ends it tells this instance.
func (s *Store) Notify(ctx context.Context, key store.Key) (bool, error) {
	if !s.events.listening(s.channel) {
		return false, store.ErrNotListening
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := notifyScript.Run(ctx, s.calls, []string{s.key(key)}, inProgressHead).Int64()
	if err != nil {
		return false, store.Unavailable("watching", err)
	}
	return n == 1, nil
}

// announce publishes an event about key. A lost end costs the waiters
// elsewhere their fallback poll; the caller decides what a lost purge costs.
func (s *Store) announce(ctx context.Context, kind byte, key store.Key) error {
	var b [1 + 2*len(store.Key{})]byte
	err := s.events.publish(ctx, s.channel, store.AppendEvent(b[:0], kind, key))
	if err != nil && kind == store.EventEnded {
		s.logger.Warn("announcing the end of a claim failed; its waiters on other instances notice it at their next poll",
			zap.String("key_hash", key.String()), zap.Error(err))
	}
	return err
}

var _ store.Notifier = (*Store)(nil)
