package redis

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The scripts check "in progress and owned by this token" by comparing one
// GETRANGE, whatever the record's size, with ARGV[1], the owner prefix, and
// answer 0 if not; ending a watched claim answers 2, not 1. Each touches one
// key: a second, even in the same slot, fails with TRYAGAIN while a Cluster
// migrates it. A completion resent after a late reply finds the record's own
// prefix and answers 3: success, though its record may not be the stored one.
var completeScript = codecScript(endsClaim + `
local head = redis.call('GETRANGE', KEYS[1], 0, {flags_offset})
local owner = string.sub(head, 1, {owner_len})
if owner == ARGV[1] then
	redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
	if bit.band(string.byte(head, {flags_offset} + 1) or 0, {watched}) ~= 0 then return 2 end
	return 1
end
if owner == string.sub(ARGV[2], 1, {owner_len}) then return 3 end
return 0
`)

var releaseScript = codecScript(`
local head = redis.call('GETRANGE', KEYS[1], 0, {flags_offset})
if string.sub(head, 1, {owner_len}) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if bit.band(string.byte(head, {flags_offset} + 1) or 0, {watched}) ~= 0 then return 2 end
return 1
`)

// endsClaim starts a script that renews or ends a running claim: Redis runs
// it when full (maxmemory reached, with noeviction), where it would refuse
// its SET or SETRANGE, and the running request would lose its claim to a
// duplicate once memory frees. New work stays refused: a claim is SET NX GET
// or takeoverScript, which declares no flags. Declaring flags also holds a
// script to the keys it declares, in one slot, as each script here is anyway.
const endsClaim = "#!lua flags=allow-oom"

// codecScript writes the layout's {owner_len}, {flags_offset}, {watched} and
// {lease_end} into the script: as arguments, Redis would convert them on
// every call.
func codecScript(src string) *goredis.Script {
	return goredis.NewScript(strings.NewReplacer(
		"{owner_len}", strconv.Itoa(store.OwnerLen),
		"{flags_offset}", strconv.Itoa(store.FlagsOffset),
		"{watched}", strconv.Itoa(store.FlagWatched),
		"{lease_end}", strconv.Itoa(leaseEndOffset),
	).Replace(src))
}

// Script answers other than success (1) and ErrNotOwner (0).
const (
	endedWatched    = 2
	completedBefore = 3
)

// renewScript sets the lease end in the claim's head to ARGV[2] ns past
// Redis's clock, which judges takeovers (takeoverScript), and moves the
// key's expiry by as much, so that the trace kept past the lease (keyLife)
// stays as long as Acquire made it.
var renewScript = codecScript(endsClaim + `
local head = redis.call('GETRANGE', KEYS[1], 0, {lease_end} + 7)
if string.sub(head, 1, {owner_len}) ~= ARGV[1] then return 0 end` + redisNow + `
local ends = now + tonumber(ARGV[2])
local moved = ends - struct.unpack('>I8', head, {lease_end} + 1)
redis.call('SETRANGE', KEYS[1], {lease_end}, struct.pack('>I8', ends))
return redis.call('PEXPIRE', KEYS[1], math.max(1, math.floor(redis.call('PTTL', KEYS[1]) + moved / 1e6 + 0.5)))
`)

// redisNow sets now to Redis's clock, in the head's unit, Unix nanoseconds;
// as Lua numbers, these times lose less than a microsecond.
const redisNow = `
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1e9 + tonumber(time[2]) * 1e3`

// bound gives ctx the call deadline on a Cluster, unless it has one as near;
// elsewhere go-redis's timeouts bound a call's two tries, without a timer.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.callTimeout == 0 {
		return ctx, noCancel
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.callTimeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.callTimeout)
}

func noCancel() {}

// now is replaced by tests.
var now = time.Now

// keyLife is how long a claim's key lives: its lease, and as long again as
// its record would be kept (Claim.TTL), so that a dead owner's retry takes
// the claim over (Acquired.TookOver) rather than run as new.
func keyLife(c *store.Claim) time.Duration {
	if c.TTL <= 0 {
		return c.Lease + defaultTrace
	}
	return c.Lease + c.TTL
}

// defaultTrace stands for a TTL the caller left out: the handler's default ttl.
const defaultTrace = 24 * time.Hour

// leaseEndOffset is where the head keeps a claim's lease end: the expiry
// field, 8 bytes before the 2-byte status that precedes the flags.
const leaseEndOffset = store.FlagsOffset - 2 - 8

// maxTakeovers bounds the takeovers one Acquire tries: each finds the key
// changed since it looked only if another request renewed, ended or took
// over the claim meanwhile.
const maxTakeovers = 3

// appendClaim appends c's claim, its lease ending a lease from now by this
// clock: a new key's claim is a plain SET NX GET, which cannot read Redis's.
// Renewals and takeovers write Redis's clock, which judges the lease.
func appendClaim(dst []byte, c *store.Claim) []byte {
	return store.AppendRecord(dst, &store.Record{
		State: store.InProgress, Token: c.Token, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint,
		CreatedAt: c.CreatedAt, ExpiresAt: now().Add(c.Lease),
	})
}

// leasePassed tells whether b is a claim whose lease has passed by this
// clock. A claim written without its lease end (by a version before it was
// kept) lives as long as its key, whose expiry is its lease.
func leasePassed(b store.Encoded, t time.Time) bool {
	end := b.ExpiresAt()
	return b.State() == store.InProgress && !end.IsZero() && !t.Before(end)
}

// Acquire claims key with SET NX GET (after a GET, with min_replicas), or
// returns the live record; the local tier answers and keeps completed ones.
// It takes over a dead owner's claim (keyLife), with takeoverScript.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (store.Acquired, error) {
	var version uint64
	if s.tier != nil {
		if blob := s.tier.Get(key); blob != nil {
			rec, err := decode(blob)
			return store.Acquired{Record: rec}, err
		}
		version = s.tier.Version()
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	k := s.key(key)
	buf := getBuffer()
	defer putBuffer(buf)
	*buf = appendClaim((*buf)[:0], c)
	w := claimWrite{key: key, k: k, c: c, claim: *buf, px: millis(keyLife(c))}
	var held []byte
	var tookOver bool
	var err error
	if s.replicas != nil {
		// Only a claim waits for the replicas, on the connection that wrote
		// it: a replay, conflict or mismatch answers from this read, as
		// without min_replicas.
		get := goredis.NewStringCmd(ctx, "get", k)
		_ = s.calls.Process(ctx, get)
		if held, err = get.Bytes(); errors.Is(err, goredis.Nil) {
			held, err = nil, nil
		}
	}
	if held == nil && err == nil {
		held, tookOver, err = s.writeClaim(ctx, w, nil)
	}
	for tries := 0; held != nil && err == nil; tries++ {
		if tries == maxTakeovers || !leasePassed(held, now()) {
			return s.found(key, held, version)
		}
		dead := held[:store.FlagsOffset]
		held, tookOver, err = s.writeClaim(ctx, w, dead)
		if bytes.HasPrefix(held, dead) {
			// Unchanged, and alive by Redis's clock, which decides.
			return s.found(key, held, version)
		}
	}
	if err != nil {
		return store.Acquired{}, store.Unavailable("acquiring", err)
	}
	return store.Acquired{TookOver: tookOver}, nil
}

// claimWrite is what an Acquire writes.
type claimWrite struct {
	key   store.Key
	k     string
	c     *store.Claim
	claim []byte // the encoded claim
	px    int64  // the key's expiry, in ms
}

// writeClaim writes w's claim: with SET NX GET, or in place of the dead
// claim whose head is dead; with min_replicas, followed by a WAIT in one
// pipeline on the key's master, so that the WAIT counts the write. It
// answers what the key held instead (nil if it holds the claim now) and
// whether the claim took a dead one's place.
func (s *Store) writeClaim(ctx context.Context, w claimWrite, dead []byte) ([]byte, bool, error) {
	var cmd goredis.Cmder
	var wait *goredis.IntCmd
	var err error
	switch {
	case s.replicas != nil:
		cmd, wait, err = s.replicas.onMaster(ctx, w.k, func(p goredis.Pipeliner, eval bool) goredis.Cmder {
			if dead == nil {
				return setClaim(ctx, p, w)
			}
			return evalScript(ctx, p, takeoverScript, eval, []string{w.k}, dead, w.claim, w.px, int64(w.c.Lease))
		})
		if err != nil {
			return nil, false, err
		}
	case dead == nil:
		cmd = setClaim(ctx, s.calls, w)
	default:
		cmd = takeoverScript.Run(ctx, s.calls, []string{w.k}, dead, w.claim, w.px, int64(w.c.Lease))
	}
	held, wrote, tookOver, err := claimReply(cmd)
	if err != nil {
		return nil, false, err
	}
	if held != nil {
		if !store.Encoded(held).ClaimedBy(w.c.Token) {
			return held, false, nil
		}
		// go-redis's retry after a lost reply found this very claim. If the
		// reply was a takeover's, saying so keeps the request from running
		// twice; a claim the key's expiry had freed is told as one too.
		tookOver = dead != nil
	}
	if s.replicas != nil {
		// A retry's first try wrote where this WAIT does not count; a claim
		// too few replicas acknowledge is withdrawn.
		err = s.replicas.claimed(wrote, wait, func() error {
			return s.Release(context.WithoutCancel(ctx), w.key, w.c.Token)
		})
	}
	return nil, tookOver, err
}

func setClaim(ctx context.Context, p caller, w claimWrite) *goredis.StringCmd {
	cmd := goredis.NewStringCmd(ctx, "set", w.k, w.claim, "nx", "px", w.px, "get")
	_ = p.Process(ctx, cmd)
	return cmd
}

// claimReply reads a SET NX GET or takeoverScript: whether it wrote the
// claim (tookOver: in place of a dead one), or else what the key held.
func claimReply(cmd goredis.Cmder) (held []byte, wrote, tookOver bool, err error) {
	if set, ok := cmd.(*goredis.StringCmd); ok {
		held, err = set.Bytes()
		if errors.Is(err, goredis.Nil) {
			return nil, true, false, nil
		}
		return held, false, false, err
	}
	script := cmd.(*goredis.Cmd)
	if s, ok := script.Val().(string); ok {
		return []byte(s), false, false, nil
	}
	n, err := script.Int64()
	return nil, err == nil, n == 1, err
}

// found answers an Acquire that found the live record held, and keeps it in
// the tier if completed.
func (s *Store) found(key store.Key, held []byte, version uint64) (store.Acquired, error) {
	rec, err := decode(held)
	if err != nil {
		return store.Acquired{}, err
	}
	if s.tier != nil && rec.State == store.Completed {
		// held is the command's own copy, which rec aliases and nothing writes.
		s.tier.Put(key, held, version)
	}
	return store.Acquired{Record: rec}, nil
}

func decode(b []byte) (*store.Record, error) {
	rec, err := store.DecodeRecord(b)
	if err != nil {
		return nil, store.Unavailable("decoding record", err)
	}
	return rec, nil
}

// Complete stores resp in place of the claim c, for ttl. Its expiry, by this
// clock, precedes Redis's TTL: no tier outlives Redis unless clocks differ.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, resp *store.Response, ttl time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	expires := now().Add(ttl)
	var blob []byte
	var version uint64
	if s.tier != nil {
		// Exact size, to be kept by the tier.
		version = s.tier.Version()
		blob = store.AppendCompleted(nil, c, resp, expires)
	} else {
		buf := getBuffer()
		defer putBuffer(buf)
		*buf = store.AppendCompleted((*buf)[:0], c, resp, expires)
		blob = *buf
	}
	keys, args := []string{s.key(key)}, []any{owner(c.Token), blob, millis(ttl)}
	var n int64
	var err error
	if s.replicas != nil {
		n, err = s.completeReplicated(ctx, keys, args, expires, c.Lease)
	} else {
		n, err = s.owned(completeScript.Run(ctx, s.calls, keys, args...), "completing")
	}
	if err != nil || n == completedBefore {
		return err
	}
	if s.tier != nil {
		s.tier.Put(key, blob, version)
	}
	if n == endedWatched {
		_ = s.announce(ctx, store.EventEnded, key)
	}
	return nil
}

// completeReplicated pipelines the completion and a WAIT on key's master, and
// resends it while the lease lasts if short: a promoted replica with only the
// claim would answer retries 409.
func (s *Store) completeReplicated(ctx context.Context, keys []string, args []any, expires time.Time, lease time.Duration) (int64, error) {
	script, wait, err := s.replicas.onMaster(ctx, keys[0], func(p goredis.Pipeliner, eval bool) goredis.Cmder {
		return evalScript(ctx, p, completeScript, eval, keys, args...)
	})
	if err != nil {
		return 0, store.Unavailable("completing", err)
	}
	n, err := s.owned(script.(*goredis.Cmd), "completing")
	if err != nil {
		return n, err
	}
	if s.replicas.short(wait) {
		s.replicas.retry(resend{
			key:      keys[0],
			owner:    args[0].([]byte),
			record:   bytes.Clone(args[1].([]byte)),
			expires:  expires,
			deadline: now().Add(lease),
		})
	}
	return n, nil
}

// Release deletes the claim held by token.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := s.owned(releaseScript.Run(ctx, s.calls, []string{s.key(key)}, owner(token)), "releasing")
	if n == endedWatched {
		_ = s.announce(ctx, store.EventEnded, key)
	}
	return err
}

// Renew sets the lease of the claim held by token to lease from now by
// Redis's clock, in its head and in the key's expiry.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, err := s.owned(renewScript.Run(ctx, s.calls, []string{s.key(key)}, owner(token), int64(lease)), "renewing")
	return err
}

// owned turns a script's 0 into ErrNotOwner, and passes other answers on.
func (s *Store) owned(cmd *goredis.Cmd, op string) (int64, error) {
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return 0, store.Unavailable(op, err)
	case n == 0:
		return 0, store.ErrNotOwner
	}
	return n, nil
}

// buffers hold encoded records until the call returns, when go-redis is done.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledBuffer keeps the odd large record from pinning pool memory.
const maxPooledBuffer = 64 << 10

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooledBuffer {
		buffers.Put(b)
	}
}

func owner(token store.Token) []byte {
	return store.AppendOwner(make([]byte, 0, store.OwnerLen), token)
}

// millis rounds d up to whole milliseconds, at least one: Redis refuses a
// zero expiry, and rounding down could end a lease early.
func millis(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

var _ store.Store = (*Store)(nil)
