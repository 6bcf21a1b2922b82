package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// deadClaim returns a claim whose lease passes at once, kept for ttl past
// it.
func deadClaim(ttl time.Duration) *store.Claim {
	c := claim(time.Millisecond)
	c.TTL = ttl
	return c
}

// keeping returns a claim with on_unknown_outcome keep.
func keeping() *store.Claim {
	c := claim(time.Minute)
	c.TTL, c.KeepUnknown = time.Minute, true
	return c
}

func mustAcquire(t testing.TB, s *Store, k store.Key, c *store.Claim) store.Acquired {
	t.Helper()
	got, err := s.Acquire(context.Background(), k, c)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return got
}

// A dead owner's claim outlives the reaper for its TTL: a retry after the
// reaper ran is still told that it takes the claim over, and with
// KeepUnknown gets the unknown outcome rather than running again.
func TestDeadClaimOutlivesTheReaper(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	kept, plain := storetest.NewKey(), storetest.NewKey()
	dead := deadClaim(time.Minute)
	mustAcquire(t, s, kept, dead)
	mustAcquire(t, s, plain, deadClaim(time.Minute))
	time.Sleep(50 * time.Millisecond)
	if _, err := s.db.reap(context.Background(), reapBatch, nil); err != nil {
		t.Fatal(err)
	}
	if got := mustAcquire(t, s, kept, keeping()); got.Record == nil || !got.TookOver || !got.Record.OutcomeUnknown ||
		got.Record.Endpoint != dead.Endpoint {
		t.Fatalf("Acquire with KeepUnknown after the reaper ran = %+v; want the dead claim's unknown outcome, taken over", got)
	}
	if got := mustAcquire(t, s, plain, claim(time.Minute)); got.Record != nil || !got.TookOver {
		t.Fatalf("Acquire after the reaper ran = %+v; want a takeover", got)
	}
}

// Once its TTL past the lease has passed too, the dead claim is reaped,
// and the key is new again.
func TestDeadClaimReapedAfterItsTTL(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	k := storetest.NewKey()
	mustAcquire(t, s, k, deadClaim(200*time.Millisecond))
	time.Sleep(400 * time.Millisecond)
	if n, err := s.db.reap(context.Background(), reapBatch, nil); n != 1 || err != nil {
		t.Fatalf("reap = %d, %v; want the dead claim deleted", n, err)
	}
	if got := mustAcquire(t, s, k, keeping()); got.Record != nil || got.TookOver {
		t.Fatalf("Acquire after the dead claim was reaped = %+v; want a new claim", got)
	}
}

// Dead claims the reaper must keep, however many, do not hold back the
// rows it may delete.
func TestReaperNotHeldBackByKeptClaims(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	for range 30 {
		mustAcquire(t, s, storetest.NewKey(), deadClaim(time.Hour))
	}
	for range 25 {
		k, c := storetest.NewKey(), claim(time.Minute)
		mustAcquire(t, s, k, c)
		if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n, err := s.db.reap(ctx, 10, nil); n != 25 || err != nil {
		t.Fatalf("reap in batches of 10 = %d, %v; want the 25 expired records, and none of the 30 kept claims", n, err)
	}
	if left := count(t, shared.DSN(), s.table); left != 30 {
		t.Fatalf("%d rows left, want the 30 kept claims", left)
	}
}

// A renewal moves the time the dead claim is kept until with its lease:
// its TTL past the lease's new end.
func TestRenewKeepsTheClaimItsTTLPastTheLease(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	k, c := storetest.NewKey(), claim(time.Minute)
	c.TTL = 36 * time.Hour // days, which an interval would add by the calendar
	mustAcquire(t, s, k, c)
	keptFor := func() time.Duration {
		t.Helper()
		var micros int64
		if err := begin(t).QueryRow(context.Background(), `SELECT (extract(epoch FROM reap_at - expires_at) * 1000000)::bigint
			FROM `+s.db.qualified+` WHERE key = $1`, k[:]).Scan(&micros); err != nil {
			t.Fatal(err)
		}
		return time.Duration(micros) * time.Microsecond
	}
	if got := keptFor(); got != c.TTL {
		t.Fatalf("a claim is kept %v past its lease, want its TTL, %v", got, c.TTL)
	}
	if err := s.Renew(context.Background(), k, c.Token, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := keptFor(); got != c.TTL {
		t.Fatalf("a renewed claim is kept %v past its lease, want its TTL, %v", got, c.TTL)
	}
}

// The takeover reports the row it replaced, not the one the claim's
// statement read before it: another request may have changed the row in
// between. The test changes it in a transaction that the takeover waits
// for.
func TestTakeoverReportsTheRowItReplaced(t *testing.T) {
	const (
		toExpiredRecord = `UPDATE {table} SET state = 'completed', status = 200, expires_at = now() - interval '1 second'
			WHERE key = $1`
		toDeadClaim = `UPDATE {table} SET state = 'in_progress', status = 0, token = $2, endpoint = 'POST /other',
			expires_at = now() - interval '1 second', reap_at = now() + interval '1 minute' WHERE key = $1`
		// a dead claim kept until its reap_at, which the reaper has not reached
		toDeadClaimReaped = `UPDATE {table} SET state = 'in_progress', status = 0, token = $2, endpoint = 'POST /other',
			expires_at = now() - interval '2 seconds', reap_at = now() - interval '1 second' WHERE key = $1`
	)
	for _, tc := range []struct {
		name     string
		seen     string // what the claim's statement reads: a dead claim, or an expired record
		replaced string // what the row is when the takeover runs
		keep     bool
		// what Acquire must answer
		tookOver, unknown bool
	}{
		{"ClaimBecameExpiredRecord", "claim", toExpiredRecord, false, false, false},
		{"ClaimBecameExpiredRecordKeep", "claim", toExpiredRecord, true, false, false},
		{"RecordBecameDeadClaim", "record", toDeadClaim, false, true, false},
		{"RecordBecameDeadClaimKeep", "record", toDeadClaim, true, true, true},
		{"ClaimPastItsReapAt", "claim", toDeadClaimReaped, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
			ctx := context.Background()
			k := storetest.NewKey()
			if tc.seen == "claim" {
				mustAcquire(t, s, k, deadClaim(time.Minute))
			} else {
				first := claim(time.Minute)
				mustAcquire(t, s, k, first)
				if err := s.Complete(ctx, k, first, &store.Response{Status: 201}, time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(20 * time.Millisecond)

			tx := begin(t)
			other := storetest.NewToken()
			sql := strings.ReplaceAll(tc.replaced, "{table}", s.db.qualified)
			args := []any{k[:]}
			if tc.replaced == toDeadClaim || tc.replaced == toDeadClaimReaped {
				args = append(args, other[:])
			}
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				t.Fatal(err)
			}
			c := claim(time.Minute)
			c.TTL, c.KeepUnknown = time.Minute, tc.keep
			type result struct {
				got store.Acquired
				err error
			}
			done := make(chan result, 1)
			go func() {
				got, err := s.Acquire(ctx, k, c)
				done <- result{got, err}
			}()
			waitForLockWait(t, tx)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("Acquire: %v", r.err)
			}
			if r.got.TookOver != tc.tookOver || (r.got.Record != nil) != tc.unknown {
				t.Fatalf("Acquire that replaced %s = %+v; want TookOver %v, unknown outcome %v", tc.name, r.got, tc.tookOver, tc.unknown)
			}
			if tc.unknown && (!r.got.Record.OutcomeUnknown || r.got.Record.Endpoint != "POST /other") {
				t.Fatalf("the unknown outcome = %+v, want the replaced claim's", r.got.Record)
			}
		})
	}
}

// A dead claim a duplicate waited for, made its unknown outcome by
// KeepUnknown, wakes the waiter like a completion would.
func TestKeepUnknownWakesWaiters(t *testing.T) {
	waiter, owner := instances(t, shared.DSN(), "", newTable(), 0)
	k, dead := storetest.NewKey(), claim(300*time.Millisecond)
	dead.TTL = time.Minute
	mustAcquire(t, owner, k, dead)
	ended, stop := store.AwaitEnd(k)
	defer stop()
	if !storetest.Notify(t, waiter, k) {
		t.Fatal("Notify found no claim in progress")
	}
	time.Sleep(400 * time.Millisecond)
	if got := mustAcquire(t, owner, k, keeping()); got.Record == nil || !got.TookOver {
		t.Fatalf("Acquire with KeepUnknown of the dead claim = %+v; want its unknown outcome", got)
	}
	storetest.WantWoken(t, ended, "the unknown outcome made of a watched dead claim")
}
