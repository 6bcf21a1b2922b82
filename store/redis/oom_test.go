package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// fill makes srv full as docs/stores/redis.md advises running it
// (maxmemory-policy noeviction): 4 MiB of junk keys, then maxmemory 2 MiB
// below what Redis uses, so that no drift of its buffers frees it, and a
// check that it refuses writes.
func fill(t *testing.T, srv *testredis.Server) {
	t.Helper()
	ctx, c := context.Background(), srv.Client()
	junk := strings.Repeat("j", 64<<10)
	for i := range 64 {
		if err := c.Set(ctx, "junk:"+strconv.Itoa(i), junk, 0).Err(); err != nil {
			t.Fatalf("writing junk: %v", err)
		}
	}
	limit := strconv.FormatInt(usedMemory(t, srv)-2<<20, 10)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", limit}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Set(ctx, "junk:more", "j", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write to the full Redis = %v, want it refused (OOM)", err)
	}
}

// A full Redis refuses new work, so that nothing runs, but lets the claims
// of running requests renew and end: a renewal refused would let a
// duplicate take a running request over once memory frees, and run it
// again (issue 35, defect 8).
func TestFullRedisLetsRunningClaimsEnd(t *testing.T) {
	srv := testredis.Start(t)
	waiter, s := instances(t, []string{srv.Addr()}, "test:"+t.Name(), 0)
	ctx := context.Background()
	renewed, watched, released := storetest.NewKey(), storetest.NewKey(), storetest.NewKey()
	cr, cw, cl := mustClaimKey(t, s, renewed), mustClaimKey(t, s, watched), mustClaimKey(t, s, released)
	dead, _ := deadOwner(t, s)
	storetest.Notify(t, waiter, storetest.NewKey()) // the waiter's subscription is up
	fill(t, srv)

	if _, err := s.Acquire(ctx, storetest.NewKey(), claim()); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a new key on a full Redis = %v, want ErrUnavailable (OOM): new work is refused", err)
	}
	// A dead owner's claim, whose SET NX GET is refused as well, is new work
	// too: its takeover and its conversion, which min_replicas reaches after
	// a GET, are refused and leave it as it is.
	held, err := srv.Client().Get(ctx, s.key(dead)).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		c := keepClaim()
		c.KeepUnknown = keep
		w := claimWrite{key: dead, k: s.key(dead), c: c, claim: appendClaim(nil, c), px: millis(keyLife(c))}
		if _, err := s.takeOver(ctx, w, held); err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Fatalf("the takeover (KeepUnknown %v) of a dead claim on a full Redis = %v, want OOM", keep, err)
		}
	}
	if now, err := srv.Client().Get(ctx, s.key(dead)).Bytes(); err != nil || string(now) != string(held) {
		t.Fatalf("the dead claim after refused takeovers: %v; want it unchanged", err)
	}
	if err := s.Renew(ctx, renewed, cr.Token, time.Minute); err != nil {
		t.Fatalf("Renew on a full Redis: %v", err)
	}
	ended, stop := store.AwaitEnd(watched)
	defer stop()
	if inProgress, err := waiter.Notify(ctx, watched); err != nil || !inProgress {
		t.Fatalf("Notify on a full Redis = %v, %v; want the claim watched", inProgress, err)
	}
	if flags(t, srv, s, watched)&store.FlagWatched == 0 {
		t.Fatal("Notify on a full Redis left the claim unwatched")
	}
	if err := s.Complete(ctx, watched, cw, testResponse("watched"), time.Minute); err != nil {
		t.Fatalf("Complete of a watched claim on a full Redis: %v", err)
	}
	storetest.WantWoken(t, ended, "a completion on a full Redis")
	if err := s.Complete(ctx, renewed, cr, testResponse("renewed"), time.Minute); err != nil {
		t.Fatalf("Complete on a full Redis: %v", err)
	}
	if err := s.Release(ctx, released, cl.Token); err != nil {
		t.Fatalf("Release on a full Redis: %v", err)
	}
	for k, body := range map[store.Key]string{watched: "watched", renewed: "renewed"} {
		v, err := srv.Client().Get(ctx, s.key(k)).Bytes()
		if rec, derr := store.DecodeRecord(v); err != nil || derr != nil || rec.State != store.Completed || string(rec.Body) != body {
			t.Fatalf("the record completed on a full Redis: %v, %v; want %q completed", err, derr, body)
		}
	}
}
