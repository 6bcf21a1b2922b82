package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A claim whose connection is lost while its statement waits for a lock
// runs on in its server session, and lands once the lock frees. Until that
// session ends, a Release of the claim that finds nothing is no answer: the
// handler's withdrawal would take it for one and stop, and with keep the
// claim, landed later, would answer every retry 502 (found by the history
// suite).
func TestReleaseOfALostClaimWaitsForItsSession(t *testing.T) {
	proxy := faultproxy.Start(t, shared.Addr())
	s := storetest.Provision(t, &Store{DSN: "postgres://postgres@" + proxy.Addr() + "/postgres?sslmode=disable", Table: newTable()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	mustAcquire(t, s, storetest.NewKey(), claim(time.Minute)) // the table exists

	// The test's transaction inserts the key first: the claim's insert
	// waits for it to end.
	tx := beginOn(t, shared.DSN())
	other := claimArgs(k, claim(time.Minute))
	if _, err := tx.Exec(ctx, s.db.q.acquire, other[:7]...); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, k, c)
		acquired <- err
	}()
	blockedBy(t, tx, 1)
	// The link fails: pgx's cancel of the statement, on a connection of
	// its own, is lost with it.
	accepted := proxy.Accepted()
	proxy.Blackhole(true)
	proxy.Cut()
	if err := <-acquired; !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire over a lost connection = %v, want ErrUnavailable", err)
	}
	waitFor(t, "pgx to send its cancel of the statement", func() bool { return proxy.Accepted() > accepted })
	proxy.Cut() // the cancel's connection, lest pgx wait for it
	proxy.Heal()

	for range 2 {
		err := s.Release(ctx, k, c.Token)
		if errors.Is(err, store.ErrNotOwner) {
			tx.Rollback(ctx)
			waitFor(t, "the lost claim to land", func() bool {
				rec, _, err := s.Lookup(ctx, k)
				return err == nil && rec != nil
			})
			t.Fatal("Release answered ErrNotOwner while the session of the lost claim ran on, and the claim then landed")
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Release while the session of the lost claim runs on = %v, want ErrUnavailable", err)
		}
	}
	tx.Rollback(ctx)
	waitFor(t, "the landed claim to be released", func() bool {
		return s.Release(ctx, k, c.Token) == nil
	})
	if rec, _, err := s.Lookup(ctx, k); rec != nil || err != nil {
		t.Fatalf("the key holds %+v, %v after the release; want nothing", rec, err)
	}
}
