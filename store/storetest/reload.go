package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// CheckReplacedByReload checks a reload that changes a store's options, so
// that the new config gets a backend of its own for the same records: old
// is the old config's store, replacement the new config's, both
// provisioned. A request of the old config holds a claim across old's
// Cleanup: it can still complete it, the new config replays it, and old's
// backend is closed once the request gives its hold back.
func CheckReplacedByReload(t *testing.T, old, replacement Module) {
	t.Helper()
	holds := store.HoldsOf(old)
	holds.Add(time.Minute) // as the handler does before its first call
	k, c := NewKey(), newClaim(time.Minute)
	if rec := mustAcquire(t, old, k, c); rec != nil {
		t.Fatalf("Acquire of a new key returned %+v", rec)
	}
	if err := old.Cleanup(); err != nil {
		t.Fatalf("Cleanup of the old config's store: %v", err)
	}
	if err := old.Renew(ctx(t), k, c.Token, time.Minute); err != nil {
		t.Fatalf("Renew after the old config's Cleanup, while its request runs: %v", err)
	}
	if err := old.Complete(ctx(t), k, c, completed(201, []byte("made")), time.Minute); err != nil {
		t.Fatalf("Complete after the old config's Cleanup, while its request holds the store: %v", err)
	}
	got, err := replacement.Acquire(ctx(t), k, newClaim(time.Minute))
	rec := got.Record
	if err != nil || rec == nil || rec.State != store.Completed || string(rec.Body) != "made" {
		t.Fatalf("the new config's Acquire of the key completed across the reload = %+v, %v; want its response", rec, err)
	}
	holds.Done()
	// The backend closes once the last hold is back and Detach's linger
	// (a second) has passed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := old.Acquire(ctx(t), NewKey(), newClaim(time.Minute))
		if errors.Is(err, store.ErrUnavailable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire on the old store 5s after its last hold was given back = %v, want ErrUnavailable (its backend closed)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := replacement.Acquire(ctx(t), NewKey(), newClaim(time.Minute)); err != nil {
		t.Fatalf("the new config's store after the old one closed: %v", err)
	}
}
