package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestBound(t *testing.T) {
	defer func(timeout time.Duration) { callTimeout = timeout }(callTimeout)
	callTimeout = time.Minute
	// A request's context, cancellable but without a deadline, gets the
	// bound, and its cancellation does not end the call's.
	req, cancel := context.WithCancel(context.Background())
	start := time.Now()
	b, cancelB := bound(req)
	defer cancelB()
	if at, ok := b.Deadline(); !ok || at.Sub(start) < time.Minute || at.Sub(start) > time.Minute+100*time.Millisecond {
		t.Fatalf("deadline %v after the call's start, want one minute", at.Sub(start))
	}
	cancel()
	if b.Err() != nil {
		t.Error("the caller's cancellation ended the call")
	}
	// A nearer deadline of the caller's stands; a further one does not.
	near, cancelNear := context.WithTimeout(context.Background(), time.Second)
	defer cancelNear()
	if n, _ := bound(near); n != near {
		t.Error("the caller's nearer deadline was replaced")
	}
	far, cancelFar := context.WithTimeout(context.Background(), time.Hour)
	defer cancelFar()
	f, cancelF := bound(far)
	defer cancelF()
	if at, _ := f.Deadline(); at.Sub(start) > time.Minute+100*time.Millisecond {
		t.Error("the caller's further deadline was kept")
	}
}

// A call on a row that another transaction holds locked waits for it, and
// must give up within the bound whatever context it came with.
func TestCallsAreBounded(t *testing.T) {
	defer func(timeout time.Duration) { callTimeout = timeout }(callTimeout)
	callTimeout = 300 * time.Millisecond
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
