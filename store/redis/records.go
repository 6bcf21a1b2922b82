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
func keyLife(c *store.Claim) time.Duration { return c.Lease + recordTTL(c) }

// recordTTL is c.TTL, or for a TTL the caller left out the handler's default.
func recordTTL(c *store.Claim) time.Duration {
	if c.TTL <= 0 {
		return 24 * time.Hour
	}
	return c.TTL
}

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
// clock. Redis's clock has the last word on a takeover (takeoverScript).
func leasePassed(b store.Encoded, t time.Time) bool {
	return b.State() == store.InProgress && !t.Before(b.ExpiresAt())
}

// Acquire claims key with SET NX GET (after a GET, with min_replicas), or
// returns the live record; the local tier answers and keeps completed ones.
// It takes over a dead owner's claim (keyLife), or with KeepUnknown turns
// it into its unknown outcome, in one script (takeOver).
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
	var got written
	var err error
	if s.replicas != nil {
		// Only a claim waits for the replicas, on the connection that wrote
		// it: a replay, conflict or mismatch answers from this read, as
		// without min_replicas.
		get := goredis.NewStringCmd(ctx, "get", k)
		_ = s.calls.Process(ctx, get)
		if got.held, err = get.Bytes(); errors.Is(err, goredis.Nil) {
			got.held, err = nil, nil
		}
	}
	if got.held == nil && err == nil {
		got, err = s.writeClaim(ctx, w)
	}
	for tries := 0; got.held != nil && !got.tookOver && err == nil; tries++ {
		if tries == maxTakeovers || !leasePassed(got.held, now()) {
			return s.found(key, got.held, version)
		}
		dead := got.held
		got, err = s.takeOver(ctx, w, dead)
		if bytes.HasPrefix(got.held, dead[:store.FlagsOffset]) {
			// Unchanged, and alive by Redis's clock, which decides.
			return s.found(key, got.held, version)
		}
	}
	switch {
	case err != nil:
		return store.Acquired{}, store.Unavailable("acquiring", err)
	case got.held != nil:
		// The dead claim's unknown outcome: a completion, announced as one.
		if got.watched {
			_ = s.announce(ctx, store.EventEnded, key)
		}
		a, err := s.found(key, got.held, version)
		a.TookOver = err == nil
		return a, err
	}
	return store.Acquired{TookOver: got.tookOver}, nil
}

// claimWrite is what an Acquire writes.
type claimWrite struct {
	key   store.Key
	k     string
	c     *store.Claim
	claim []byte // the encoded claim
	px    int64  // the key's expiry, in ms
}

// written is what an Acquire's write left in the key.
type written struct {
	held []byte // what the key holds instead of the claim; nil if the claim holds it
	// tookOver is set when the claim, or with KeepUnknown held, the dead
	// claim's unknown outcome, took a dead owner's claim's place.
	tookOver bool
	watched  bool // the dead claim turned into held had waiters to wake
}

// writeClaim claims w's key with SET NX GET, answering what it holds instead.
func (s *Store) writeClaim(ctx context.Context, w claimWrite) (written, error) {
	cmd, wait, err := s.write(ctx, w, nil)
	if err != nil {
		return written{}, err
	}
	held, err := cmd.(*goredis.StringCmd).Bytes()
	wrote := errors.Is(err, goredis.Nil)
	switch {
	case wrote:
	case err != nil:
		return written{}, err
	case !store.Encoded(held).ClaimedBy(w.c.Token):
		return written{held: held}, nil
	}
	// Written, or found by go-redis's retry after a lost reply: a claim the
	// key's expiry had freed is told as one.
	return written{}, s.claimed(ctx, w, wrote, wait)
}

// write sends w's SET NX GET, or script (a takeover) with args; with
// min_replicas, followed by a WAIT in one pipeline on the key's master, so
// that the WAIT counts the write.
func (s *Store) write(ctx context.Context, w claimWrite, script *goredis.Script, args ...any) (goredis.Cmder, *goredis.IntCmd, error) {
	switch {
	case s.replicas != nil:
		return s.replicas.onMaster(ctx, w.k, func(p goredis.Pipeliner, eval bool) goredis.Cmder {
			if script == nil {
				return setClaim(ctx, p, w)
			}
			return evalScript(ctx, p, script, eval, []string{w.k}, args...)
		})
	case script == nil:
		return setClaim(ctx, s.calls, w), nil, nil
	}
	return script.Run(ctx, s.calls, []string{w.k}, args...), nil, nil
}

// claimed waits, with min_replicas, for the replicas to have w's claim, and
// withdraws it if too few do. A retry's first try wrote where this WAIT
// does not count: unless wrote, the claim is withdrawn too.
func (s *Store) claimed(ctx context.Context, w claimWrite, wrote bool, wait *goredis.IntCmd) error {
	if s.replicas == nil {
		return nil
	}
	return s.replicas.claimed(wrote, wait, func() error {
		return s.Release(context.WithoutCancel(ctx), w.key, w.c.Token)
	})
}

func setClaim(ctx context.Context, p caller, w claimWrite) *goredis.StringCmd {
	cmd := goredis.NewStringCmd(ctx, "set", w.k, w.claim, "nx", "px", w.px, "get")
	_ = p.Process(ctx, cmd)
	return cmd
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
// claim would answer retries 409, then let them take it over (resend).
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
