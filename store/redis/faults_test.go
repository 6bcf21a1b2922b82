package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// faultTimeout is the dial, read and write timeout of the stores behind a
// faultproxy; callBound is how long any call may take when the network
// misbehaves: one retry of a timed-out read, and a redial, fit in it.
const (
	faultTimeout = 200 * time.Millisecond
	callBound    = time.Second
)

// openProxied returns a Redis, a proxy in front of it and a store that
// talks to Redis through the proxy only, with short timeouts.
func openProxied(t *testing.T) (*testredis.Server, *faultproxy.Proxy, *Store) {
	t.Helper()
	srv := testredis.Start(t)
	p := faultproxy.Start(t, srv.Addr())
	s := storetest.Provision(t, &Store{
		Addresses:    []string{p.Addr()},
		KeyPrefix:    "faults",
		DialTimeout:  caddy.Duration(faultTimeout),
		ReadTimeout:  caddy.Duration(faultTimeout),
		WriteTimeout: caddy.Duration(faultTimeout),
	})
	return srv, p, s
}

// timedCall is one store call and how long it took.
type timedCall struct {
	name string
	took time.Duration
	err  error
}

// everyCall makes each store call once on a fresh key and times it.
func everyCall(s *Store) []timedCall {
	ctx := context.Background()
	k, c := storetest.NewKey(), claim()
	var calls []timedCall
	run := func(name string, f func() error) {
		start := time.Now()
		err := f()
		calls = append(calls, timedCall{name, time.Since(start), err})
	}
	run("Acquire", func() error {
		rec, err := acquireRecord(ctx, s, k, c)
		if err == nil && rec != nil {
			return errors.New("a fresh key was found claimed")
		}
		return err
	})
	run("Renew", func() error { return s.Renew(ctx, k, c.Token, time.Minute) })
	run("Complete", func() error { return s.Complete(ctx, k, c, testResponse("x"), time.Minute) })
	k, c = storetest.NewKey(), claim()
	run("Acquire", func() error { _, err := s.Acquire(ctx, k, c); return err })
	run("Release", func() error { return s.Release(ctx, k, c.Token) })
	return calls
}

// wantAllUnavailable fails unless every call failed with ErrUnavailable
// within callBound.
func wantAllUnavailable(t *testing.T, what string, calls []timedCall) {
	t.Helper()
	for _, c := range calls {
		if !errors.Is(c.err, store.ErrUnavailable) {
			t.Errorf("%s: %s = %v, want ErrUnavailable", what, c.name, c.err)
		}
		if c.took > callBound {
			t.Errorf("%s: %s took %v, want under %v (read_timeout %v)", what, c.name, c.took, callBound, faultTimeout)
		}
	}
	t.Logf("%s: %s", what, describeCalls(calls))
}

// wantAllOK fails unless every call succeeded.
func wantAllOK(t *testing.T, what string, calls []timedCall) {
	t.Helper()
	for _, c := range calls {
		if c.err != nil {
			t.Errorf("%s: %s = %v", what, c.name, c.err)
		}
	}
}

func describeCalls(calls []timedCall) string {
	var out string
	for i, c := range calls {
		if i > 0 {
			out += ", "
		}
		out += c.name + " " + c.took.Round(time.Millisecond).String()
	}
	return out
}

// A slow link, under read_timeout: every call works, just slower.
func TestFaultLatencyUnderReadTimeout(t *testing.T) {
	_, p, s := openProxied(t)
	wantAllOK(t, "warm-up", everyCall(s))
	p.SetLatency(40 * time.Millisecond) // 80ms per round trip
	calls := everyCall(s)
	wantAllOK(t, "40ms latency", calls)
	for _, c := range calls {
		if c.took < 80*time.Millisecond {
			t.Errorf("%s took %v through an 80ms round trip: the latency was not applied", c.name, c.took)
		}
	}
}

// Redis answers later than read_timeout: every call fails with
// ErrUnavailable within a bound. A claim whose answer came too late may
// still have been made, so the key stays held until its lease passes (the
// handler ran nothing and answered 503; duplicates get 409 meanwhile), and
// its owner, retrying with the same token, gets it back.
func TestFaultLatencyAboveReadTimeout(t *testing.T) {
	srv, p, s := openProxied(t)
	ctx := context.Background()
	// A pooled connection, so that the SET goes out at once rather than
	// after a connection handshake that would itself time out.
	wantAllOK(t, "warm-up", everyCall(s))

	p.SetLatency(300 * time.Millisecond) // 600ms per round trip, read_timeout 200ms
	k, c := storetest.NewKey(), claim()
	start := time.Now()
	if _, err := s.Acquire(ctx, k, c); !errors.Is(err, store.ErrUnavailable) || time.Since(start) > callBound {
		t.Fatalf("Acquire through a slow link = %v after %v, want ErrUnavailable within %v", err, time.Since(start), callBound)
	}
	wantAllUnavailable(t, "300ms latency", everyCall(s))

	// The timed-out SET was on its way: it reaches Redis after the latency.
	var landed bool
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n, _ := srv.Client().Exists(ctx, s.key(k)).Result(); n == 1 {
			landed = true
			break
		}
	}
	if !landed {
		t.Fatal("the timed-out claim never reached Redis")
	}
	p.Heal()
	// A duplicate sees the claim; the owner's own retry is its claim again.
	wantStoredRecord(t, s, k, store.InProgress, "", c.Token)
	if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
		t.Fatalf("the owner's retry = %+v, %v; want its own claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, testResponse("late"), time.Minute); err != nil {
		t.Fatalf("Complete after the link healed: %v", err)
	}
	wantStoredRecord(t, s, k, store.Completed, "late", store.Token{})
	wantAllOK(t, "after Heal", everyCall(s))
}

// The link swallows everything: calls on open connections and on new
// ones (accepted, never answered) fail within a bound, and the store
// recovers by itself once the link is back.
func TestFaultBlackhole(t *testing.T) {
	_, p, s := openProxied(t)
	wantAllOK(t, "warm-up", everyCall(s))

	p.Blackhole(true)
	wantAllUnavailable(t, "blackhole", everyCall(s))
	// The timed-out connections were dropped; new ones are accepted into
	// the blackhole and fail the same way.
	wantAllUnavailable(t, "blackhole, new connections", everyCall(s))
	if p.Accepted() < 2 {
		t.Fatalf("the store opened %d connections in all, want new ones during the blackhole", p.Accepted())
	}

	p.Heal()
	p.Cut() // also let go of the connections held by the blackhole
	start := time.Now()
	for {
		calls := everyCall(s)
		ok := true
		for _, c := range calls {
			if c.err != nil {
				if !errors.Is(c.err, store.ErrUnavailable) {
					t.Fatalf("after the blackhole: %s = %v", c.name, c.err)
				}
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("the store did not recover within 3s of the blackhole ending: %v", calls)
		}
	}
	t.Logf("recovered %v after the blackhole ended", time.Since(start).Round(time.Millisecond))
}

// Every connection is cut between calls (a restart of a proxy, a NAT
// timeout): the very next call succeeds, on a new connection.
func TestFaultCutConnections(t *testing.T) {
	_, p, s := openProxied(t)
	wantAllOK(t, "warm-up", everyCall(s))
	ctx := context.Background()
	for i := range 5 {
		before := p.Accepted()
		p.Cut()
		k, c := storetest.NewKey(), claim()
		if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
			t.Fatalf("round %d: Acquire after a cut = %+v, %v", i, rec, err)
		}
		p.Cut()
		if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
			t.Fatalf("round %d: Renew after a cut: %v", i, err)
		}
		p.Cut()
		if err := s.Complete(ctx, k, c, testResponse("cut"), time.Minute); err != nil {
			t.Fatalf("round %d: Complete after a cut: %v", i, err)
		}
		p.Cut()
		wantStoredRecord(t, s, k, store.Completed, "cut", store.Token{})
		if p.Accepted() == before {
			t.Fatalf("round %d: no new connection after the cuts", i)
		}
	}
}

// Connections are cut while calls are in flight: each call either
// succeeds or fails with ErrUnavailable, within the bound, and the record
// is consistent with the answer the caller got.
func TestFaultCutInFlight(t *testing.T) {
	_, p, s := openProxied(t)
	wantAllOK(t, "warm-up", everyCall(s))
	ctx := context.Background()
	p.SetLatency(10 * time.Millisecond)
	var ok, unavailable int
	for i := range 20 {
		k, c := storetest.NewKey(), claim()
		// The cut lands before, during or after the round trip.
		timer := time.AfterFunc(time.Duration(i)*2*time.Millisecond, p.Cut)
		start := time.Now()
		rec, err := acquireRecord(ctx, s, k, c)
		took := time.Since(start)
		timer.Stop()
		if took > callBound {
			t.Errorf("Acquire with a cut took %v", took)
		}
		switch {
		case err == nil && rec == nil:
			ok++
			wantStoredRecord(t, s, k, store.InProgress, "", c.Token)
			if err := s.Complete(ctx, k, c, testResponse("x"), time.Minute); err != nil {
				t.Fatalf("Complete after a cut Acquire that claimed: %v", err)
			}
		case errors.Is(err, store.ErrUnavailable):
			unavailable++
			// The claim may or may not have been made; if it was, it is
			// ours and our retry finds it.
			if rec, err := acquireRecord(ctx, s, k, c); rec != nil || err != nil {
				t.Fatalf("retry after an unavailable Acquire = %+v, %v; want the claim", rec, err)
			}
		default:
			t.Fatalf("Acquire with a cut = %+v, %v", rec, err)
		}
	}
	t.Logf("20 calls cut in flight: %d succeeded (go-redis retried on a new connection), %d unavailable", ok, unavailable)
}

// A store whose very first connections go into a blackhole: provisioning
// does not hang, and calls fail within the bound.
func TestFaultBlackholeFromTheStart(t *testing.T) {
	srv := testredis.Start(t)
	p := faultproxy.Start(t, srv.Addr())
	p.Blackhole(true)
	start := time.Now()
	s := storetest.Provision(t, &Store{
		Addresses:    []string{p.Addr()},
		DialTimeout:  caddy.Duration(faultTimeout),
		ReadTimeout:  caddy.Duration(faultTimeout),
		WriteTimeout: caddy.Duration(faultTimeout),
	})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Provision through a blackhole took %v", took)
	}
	wantAllUnavailable(t, "blackhole from the start", everyCall(s))
	p.Heal()
	p.Cut()
	wantAllOK(t, "after the blackhole", everyCall(s))
}

// The command reaches Redis and runs, but its answer is later than
// read_timeout, and go-redis sends it again on a new connection, where the
// answer is quick: the second run sees the first one's work. Each call must
// still leave the right record, and report what really happened.
func TestFaultLateReplyThenRetry(t *testing.T) {
	_, p, s := openProxied(t)
	wantAllOK(t, "warm-up", everyCall(s))
	ctx := context.Background()

	// lateReply runs f with the first answer held back 500ms, past
	// read_timeout; the link heals while the first attempt waits, so the
	// retry is answered at once.
	lateReply := func(f func() error) (error, time.Duration) {
		t.Helper()
		p.SetLatencies(0, 500*time.Millisecond)
		heal := time.AfterFunc(100*time.Millisecond, p.Heal)
		defer heal.Stop()
		start := time.Now()
		err := f()
		return err, time.Since(start)
	}

	t.Run("Acquire", func(t *testing.T) {
		k, c := storetest.NewKey(), claim()
		var rec *store.Record
		err, took := lateReply(func() (err error) { rec, err = acquireRecord(ctx, s, k, c); return err })
		// The retry finds the claim the first attempt made: it is ours.
		if err != nil || rec != nil {
			t.Fatalf("Acquire whose first answer was late = %+v, %v; want the claim", rec, err)
		}
		wantStoredRecord(t, s, k, store.InProgress, "", c.Token)
		t.Logf("Acquire: claimed after %v", took.Round(time.Millisecond))
	})

	t.Run("Renew", func(t *testing.T) {
		k, c := storetest.NewKey(), claim()
		mustAcquireFresh(t, s, k, c)
		err, _ := lateReply(func() error { return s.Renew(ctx, k, c.Token, time.Minute) })
		if err != nil {
			t.Fatalf("Renew whose first answer was late = %v", err)
		}
		wantStoredRecord(t, s, k, store.InProgress, "", c.Token)
	})

	t.Run("Complete", func(t *testing.T) {
		k, c := storetest.NewKey(), claim()
		mustAcquireFresh(t, s, k, c)
		err, _ := lateReply(func() error {
			return s.Complete(ctx, k, c, testResponse("stored"), time.Minute)
		})
		// The first attempt stored the response: it replays, and nobody
		// can take the key over. The retry's script finds the record this
		// owner completed and reports success, not a lost claim.
		wantStoredRecord(t, s, k, store.Completed, "stored", store.Token{})
		if err != nil {
			t.Fatalf("Complete whose first answer was late = %v, want success", err)
		}
	})

	t.Run("Release", func(t *testing.T) {
		k, c := storetest.NewKey(), claim()
		mustAcquireFresh(t, s, k, c)
		err, _ := lateReply(func() error { return s.Release(ctx, k, c.Token) })
		// Released by the first attempt; the retry finds nothing. The
		// handler ignores ErrNotOwner on release.
		if err != nil && !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("Release whose first answer was late = %v", err)
		}
		if rec, err := acquireRecord(ctx, s, k, claim()); rec != nil || err != nil {
			t.Fatalf("Acquire after the release = %+v, %v; want a new claim", rec, err)
		}
		t.Logf("Release whose first answer was late returned %v", err)
	})
}

func mustAcquireFresh(t *testing.T, s *Store, k store.Key, c *store.Claim) {
	t.Helper()
	if rec, err := acquireRecord(context.Background(), s, k, c); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v; want a claim", rec, err)
	}
}
