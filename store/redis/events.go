package redis

import (
	"context"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The events that instances announce on their prefix's channel are
// store.AppendEvent's.
//
// Announcing the end of every claim would cost Redis a delivery to every
// instance per new key. So a waiter that finds a claim in progress marks
// it watched (notifyScript): it sets store.FlagWatched in the claim
// itself, which keeps the claim's expiry and lives exactly as long as the
// claim. The completion and release scripts, which read the claim's head
// anyway, report the flag, and only then is the end announced: a claim
// nobody waits for costs nothing more. A purge is always announced, for
// the local tiers.

// notifyScript sets store.FlagWatched in the flags byte of KEYS[1] if it
// is an in-progress claim (whose head is ARGV[1]), in place, so that its
// expiry is kept; it answers 1 if the claim was in progress, 0 if not. The
// check and the flag are one step, so a completion either comes after the
// flag and sees it, or before the check and is seen by it.
var notifyScript = codecScript(`
local head = redis.call('GETRANGE', KEYS[1], 0, {flags_offset})
if string.sub(head, 1, #ARGV[1]) ~= ARGV[1] or #head ~= {flags_offset} + 1 then return 0 end
local flags = string.byte(head, #head)
if bit.band(flags, {watched}) == 0 then
	redis.call('SETRANGE', KEYS[1], {flags_offset}, string.char(bit.bor(flags, {watched})))
end
return 1
`)

var inProgressHead = string(store.StatePrefix(store.InProgress))

// Notify implements store.Notifier: it marks key's claim watched, so that
// whichever instance completes or releases it announces the end, and this
// instance's subscriber wakes the waiters here.
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

// announce publishes an event about key. A lost announcement of an end
// costs the waiters elsewhere their fallback poll; the caller decides what
// a lost purge costs.
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
