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
var completeScript = codecScript(`
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

// codecScript writes the layout's {owner_len}, {flags_offset} and {watched}
// into the script: as arguments, Redis would convert them on every call.
func codecScript(src string) *goredis.Script {
	return goredis.NewScript(strings.NewReplacer(
		"{owner_len}", strconv.Itoa(store.OwnerLen),
		"{flags_offset}", strconv.Itoa(store.FlagsOffset),
		"{watched}", strconv.Itoa(store.FlagWatched),
	).Replace(src))
}

// Script answers other than success (1) and ErrNotOwner (0).
const (
	endedWatched    = 2
	completedBefore = 3
)

var renewScript = goredis.NewScript(`
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`)

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

// Acquire claims key with SET NX GET, or returns the live record; the local
// tier answers and keeps completed ones. TookOver stays false: a dead owner's
// claim expires with its lease, and SET NX cannot tell it was there.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (store.Acquired, error) {
	rec, err := s.acquire(ctx, key, c)
	return store.Acquired{Record: rec}, err
}

func (s *Store) acquire(ctx context.Context, key store.Key, c *store.Claim) (*store.Record, error) {
	var version uint64
	if s.tier != nil {
		if blob := s.tier.Get(key); blob != nil {
			return decode(blob)
		}
		version = s.tier.Version()
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	buf := getBuffer()
	defer putBuffer(buf)
	*buf = store.AppendClaim((*buf)[:0], c)
	cmd := goredis.NewStringCmd(ctx, "set", s.key(key), *buf, "nx", "px", millis(c.Lease), "get")
	if s.replicas != nil {
		return s.acquireReplicated(ctx, key, c, cmd, version)
	}
	_ = s.calls.Process(ctx, cmd)
	rec, _, err := s.claimAnswer(cmd, c, version, key)
	return rec, err
}

// acquireReplicated runs cmd on key's master, waiting for replicas if it claimed.
func (s *Store) acquireReplicated(ctx context.Context, key store.Key, c *store.Claim, cmd *goredis.StringCmd, version uint64) (*store.Record, error) {
	conn, err := s.replicas.onMaster(ctx, cmd.Args()[1].(string), func(p goredis.Pipeliner, _ bool) goredis.Cmder {
		_ = p.Process(ctx, cmd)
		return cmd
	})
	if err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	defer conn.Close()
	rec, claimed, err := s.claimAnswer(cmd, c, version, key)
	if !claimed {
		return rec, err
	}
	err = s.replicas.claimed(ctx, conn, func() error {
		return s.Release(context.WithoutCancel(ctx), key, c.Token)
	})
	if err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	return nil, nil
}

// claimAnswer reads a SET NX GET: claimed, or the live record it found.
func (s *Store) claimAnswer(cmd *goredis.StringCmd, c *store.Claim, version uint64, key store.Key) (*store.Record, bool, error) {
	old, err := cmd.Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, store.Unavailable("acquiring", err)
	}
	rec, err := decode(old)
	if err != nil {
		return nil, false, err
	}
	// go-redis's retry after a lost reply may find this very claim.
	if rec.State == store.InProgress && rec.Token == c.Token {
		return nil, true, nil
	}
	if s.tier != nil && rec.State == store.Completed {
		// old is the command's own copy, which rec aliases and nothing writes.
		s.tier.Put(key, old, version)
	}
	return rec, false, nil
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
	var script *goredis.Cmd
	var wait *goredis.IntCmd
	conn, err := s.replicas.onMaster(ctx, keys[0], func(p goredis.Pipeliner, eval bool) goredis.Cmder {
		if eval {
			script = completeScript.Eval(ctx, p, keys, args...)
		} else {
			script = completeScript.EvalSha(ctx, p, keys, args...)
		}
		wait = s.replicas.queueWait(ctx, p)
		return script
	})
	if err != nil {
		return 0, store.Unavailable("completing", err)
	}
	_ = conn.Close()
	n, err := s.owned(script, "completing")
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

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, err := s.owned(renewScript.Run(ctx, s.calls, []string{s.key(key)}, owner(token), millis(lease)), "renewing")
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
