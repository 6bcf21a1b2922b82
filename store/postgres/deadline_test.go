package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestDeadlinesShared(t *testing.T) {
	d := &deadlines{timeout: time.Minute, slack: time.Second}
	defer d.stop()
	start := time.Now()
	a := d.bound(context.Background())
	at, ok := a.Deadline()
	if !ok || at.Sub(start) < time.Minute || at.Sub(start) > time.Minute+time.Second+100*time.Millisecond {
		t.Fatalf("shared deadline %v after the call's start, want one minute plus at most the slack", at.Sub(start))
	}
	// A request's context, cancellable but without a deadline, gets the
	// same bound; so does one whose deadline is further away.
	req, cancel := context.WithCancel(context.Background())
	defer cancel()
	far, cancelFar := context.WithTimeout(context.Background(), time.Hour)
	defer cancelFar()
	if b, c := d.bound(req), d.bound(far); b != a || c != a {
		t.Error("calls within the slack did not share one context")
	}
	// A nearer deadline of the caller's stands.
	near, cancelNear := context.WithTimeout(context.Background(), time.Second)
	defer cancelNear()
	if d.bound(near) != near {
		t.Error("the caller's nearer deadline was replaced")
	}
	// Once the shared deadline is nearer than the timeout, the next call
	// gets a new one, and the old one still ends at its time.
	old := d.cur.Load()
	old.at = time.Now().Add(time.Minute - time.Millisecond)
	if d.bound(context.Background()) == a {
		t.Error("a deadline nearer than the timeout was handed out")
	}
	if a.Err() != nil {
		t.Error("the previous context ended early")
	}
}

// A call on a row that another transaction holds locked waits for it, and
// must give up within the bound whatever context it came with.
func TestCallsAreBounded(t *testing.T) {
	defer func(timeout, slack time.Duration) { callTimeout, deadlineSlack = timeout, slack }(callTimeout, deadlineSlack)
	callTimeout, deadlineSlack = 300*time.Millisecond, 100*time.Millisecond
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	// k's claim is live, expired's has passed: taking it over waits for
	// the lock too.
	k, c := storetest.NewKey(), claim(time.Minute)
	expired := storetest.NewKey()
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, expired, claim(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	tx := begin(t)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s.db.qualified+" WHERE key IN ($1, $2) FOR UPDATE", k[:], expired[:]); err != nil {
		t.Fatal(err)
	}
	req, cancel := context.WithCancel(ctx) // as a request's: no deadline
	defer cancel()
	for _, call := range []struct {
		name string
		run  func() error
	}{
		{"Acquire", func() error { _, err := s.Acquire(req, expired, claim(time.Minute)); return err }},
		{"Complete", func() error { return s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute) }},
		{"Renew", func() error { return s.Renew(req, k, c.Token, time.Minute) }},
		{"Release", func() error { return s.Release(ctx, k, c.Token) }},
	} {
		start := time.Now()
		err := call.run()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s on a locked row = %v, want ErrUnavailable", call.name, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s took %v with a call timeout of 300ms", call.name, took)
		}
	}
}
