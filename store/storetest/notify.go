package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Notifying is a store shared by several instances that wakes their
// waiting duplicates (store.Notifier), with the Inspector whose purge
// announces an end too.
type Notifying interface {
	store.Store
	store.Notifier
	store.Inspector
}

// Notify calls n.Notify until the subscription it starts is up, and
// returns whether the claim was in progress.
func Notify(t testing.TB, n store.Notifier, k store.Key) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inProgress, err := n.Notify(context.Background(), k)
		switch {
		case err == nil:
			return inProgress
		case !errors.Is(err, store.ErrNotListening) || time.Now().After(deadline):
			t.Fatalf("Notify: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WantWoken fails unless ended closes. In these tests nothing but the
// store's subscription closes it (no handler runs, and there is no
// fallback poll), so a close at all is the proof; the timeout, far less
// than a waiter's fallback poll would allow in a real deployment plus its
// slack, only bounds a failing test.
func WantWoken(t testing.TB, ended <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not wake the waiter", what)
	}
}

// WantNotWoken fails if ended closes within 200ms.
func WantNotWoken(t testing.TB, ended <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ended:
		t.Fatalf("%s woke the waiter", what)
	case <-time.After(200 * time.Millisecond):
	}
}

// NotifyWakes checks that a waiter on one instance is woken when the owner
// on another completes or releases the claim, or an operator purges it,
// and that a renewal wakes nobody.
func NotifyWakes(t *testing.T, waiter store.Notifier, owner Notifying) {
	t.Helper()
	ctx := context.Background()
	for _, end := range []struct {
		name string
		f    func(k store.Key, c *store.Claim) error
	}{
		{"Complete", func(k store.Key, c *store.Claim) error {
			return owner.Complete(ctx, k, c, &store.Response{Status: 201}, time.Minute)
		}},
		{"Release", func(k store.Key, c *store.Claim) error { return owner.Release(ctx, k, c.Token) }},
		{"Delete", func(k store.Key, c *store.Claim) error { _, err := owner.Delete(ctx, k); return err }},
	} {
		k, c := NewKey(), newClaim(time.Minute)
		if got, err := owner.Acquire(ctx, k, c); got.Record != nil || err != nil {
			t.Fatalf("Acquire = %v, %v", got.Record, err)
		}
		ended, stop := store.AwaitEnd(k)
		if !Notify(t, waiter, k) {
			t.Fatalf("%s: Notify found no claim in progress", end.name)
		}
		if err := owner.Renew(ctx, k, c.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
		WantNotWoken(t, ended, "a renewal")
		if err := end.f(k, c); err != nil {
			t.Fatalf("%s: %v", end.name, err)
		}
		WantWoken(t, ended, end.name)
		stop()
	}
}
