package redis

import (
	"bytes"
	"context"
	"errors"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// findDead starts the takeover scripts: held is the key's value, and what
// the key holds is answered as it is, for Acquire to decide again, unless it
// is the dead owner's claim whose head up to its flags is ARGV[1] (renewed,
// ended, taken over by another, it is not), with its lease passed by
// Redis's clock, the one clock all instances share. The flags are left out
// of the comparison: a waiter may have marked the dead claim watched.
const findDead = `
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) ~= ARGV[1] then return held end` + redisNow + `
if held and struct.unpack('>I8', held, {lease_end} + 1) > now then return held end`

// takeoverScript replaces the dead claim with the claim ARGV[2] for ARGV[3]
// ms, its lease ending ARGV[4] ns past Redis's clock, and answers 1; a key
// gone meanwhile it claims too, answering 0.
var takeoverScript = codecScript(findDead + `
local claim = string.sub(ARGV[2], 1, {lease_end}) .. struct.pack('>I8', now + tonumber(ARGV[4])) .. string.sub(ARGV[2], {lease_end} + 9)
redis.call('SET', KEYS[1], claim, 'PX', ARGV[3])
if held then return 1 end
return 0
`)

// unknownScript replaces the dead claim with its unknown outcome, the record
// ARGV[2], for ARGV[3] ms, and answers 1, or 2 (endedWatched) if a waiter
// had marked it watched. A key gone meanwhile it leaves, answering nothing:
// a new key, for SET NX GET to claim. Neither script declares flags: a full
// Redis refuses their SET, so that new work and a dead owner's alike wait
// for memory (endsClaim).
var unknownScript = codecScript(findDead + `
if not held then return false end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if bit.band(string.byte(held, {flags_offset} + 1), {watched}) ~= 0 then return 2 end
return 1
`)

// takeOver takes the dead owner's claim dead over for w, or with KeepUnknown
// turns it into its request's unknown outcome (unknownOutcome); with
// min_replicas, either waits for the replicas as a claim does.
func (s *Store) takeOver(ctx context.Context, w claimWrite, dead []byte) (written, error) {
	if w.c.KeepUnknown {
		return s.keepUnknown(ctx, w, dead)
	}
	cmd, wait, err := s.write(ctx, w, takeoverScript, dead[:store.FlagsOffset], w.claim, w.px, int64(w.c.Lease))
	if err != nil {
		return written{}, err
	}
	script := cmd.(*goredis.Cmd)
	n, err := script.Int64()
	wrote := err == nil
	if held, ok := script.Val().(string); ok {
		if !store.Encoded(held).ClaimedBy(w.c.Token) {
			return written{held: []byte(held)}, nil
		}
		// go-redis's retry after a lost reply found this very claim: saying
		// it took a dead one over keeps the request from running twice.
		n, err = 1, nil
	}
	if err != nil {
		return written{}, err
	}
	return written{tookOver: n == 1}, s.claimed(ctx, w, wrote, wait)
}

// keepUnknown turns the dead claim dead into its unknown outcome for w.
func (s *Store) keepUnknown(ctx context.Context, w claimWrite, dead []byte) (written, error) {
	record, err := unknownOutcome(dead, w.c)
	if err != nil {
		return written{}, err
	}
	cmd, wait, err := s.write(ctx, w, unknownScript, dead[:store.FlagsOffset], record, millis(recordTTL(w.c)))
	if err != nil {
		return written{}, err
	}
	script := cmd.(*goredis.Cmd)
	n, err := script.Int64()
	wrote := err == nil
	held, isHeld := script.Val().(string)
	switch {
	case errors.Is(err, goredis.Nil):
		return s.writeClaim(ctx, w)
	case isHeld && !bytes.HasPrefix([]byte(held), completedBy(w.c.Token)):
		return written{held: []byte(held)}, nil
	case isHeld:
		// go-redis's retry after a lost reply found this very record; its
		// waiters, if any, are left to their poll.
	case err != nil:
		return written{}, err
	}
	if s.replicas != nil {
		s.replicas.unknownKept(wrote, wait)
	}
	return written{held: record, tookOver: true, watched: n == endedWatched}, nil
}

// unknownOutcome is the record a dead owner's claim, dead, becomes with
// KeepUnknown: its request's unknown outcome, bound as the claim was, kept
// for c's TTL, under c's token. Under the dead owner's own, the owner, if
// only slow, would find its own prefix in its late Complete, and be told
// its response was stored (completedBefore) when it was not.
func unknownOutcome(dead []byte, c *store.Claim) ([]byte, error) {
	claim, err := store.DecodeRecord(dead)
	if err != nil {
		return nil, err
	}
	return store.AppendRecord(nil, &store.Record{
		State: store.Completed, Token: c.Token,
		Endpoint: claim.Endpoint, Fingerprint: claim.Fingerprint, CreatedAt: claim.CreatedAt,
		Response: store.Response{OutcomeUnknown: true}, ExpiresAt: now().Add(recordTTL(c)),
	}), nil
}

// completedBy is how a completed record held by token starts.
func completedBy(token store.Token) []byte {
	return append(store.StatePrefix(store.Completed), token[:]...)
}
