package store

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestSignalEndWakesEveryWaiterOfItsKeyOnly(t *testing.T) {
	k, other := NewKey("", "a"), NewKey("", "b")
	a, stopA := AwaitEnd(k)
	b, stopB := AwaitEnd(k)
	c, stopC := AwaitEnd(other)
	defer stopA()
	defer stopB()
	defer stopC()
	SignalEnd(k)
	if !closed(a) || !closed(b) {
		t.Fatal("a waiter of the key was not woken")
	}
	if closed(c) {
		t.Fatal("a waiter of another key was woken")
	}
	// The next wait on k is a new one.
	d, stopD := AwaitEnd(k)
	defer stopD()
	if closed(d) {
		t.Fatal("a wait that began after the end saw it")
	}
}

func TestWithdrawnWatchesLeaveNothing(t *testing.T) {
	before := Awaited()
	k := NewKey("", "withdrawn")
	_, stop1 := AwaitEnd(k)
	_, stop2 := AwaitEnd(k)
	if Awaited() != before+1 {
		t.Fatalf("two waiters of one key hold %d entries", Awaited()-before)
	}
	stop1()
	if Awaited() != before+1 {
		t.Fatal("the key was dropped while a waiter remained")
	}
	stop2()
	if Awaited() != before {
		t.Fatal("the last waiter's stop left the key behind")
	}
	// A stop after the end (the waiter woke, then withdrew) is harmless.
	_, stop := AwaitEnd(k)
	SignalEnd(k)
	stop()
	if Awaited() != before {
		t.Fatal("a stop after the end left the key behind")
	}
}

func TestSubscriptionLossesRegisterTwice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	va, err := SubscriptionLosses(reg)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := SubscriptionLosses(reg)
	if err != nil {
		t.Fatalf("a second registration (a config reload) failed: %v", err)
	}
	a, b := va.WithLabelValues("redis"), vb.WithLabelValues("redis")
	before := testutil.ToFloat64(a)
	b.Inc()
	if got := testutil.ToFloat64(a); got != before+1 {
		t.Fatalf("the two registrations count apart: %v, want %v", got, before+1)
	}
	if _, err := SubscriptionLosses(nil); err != nil {
		t.Fatalf("without a registry: %v", err)
	}
}
