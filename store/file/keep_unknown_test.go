package file

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// deadClaim makes k a dead owner's claim for s: claimed for a minute, by
// the clock of two minutes on, which the caller sets until the test ends.
func deadClaim(t *testing.T, s *Store, k store.Key) *store.Claim {
	t.Helper()
	dead := claim(time.Minute)
	dead.Endpoint, dead.TTL = deadEndpoint, time.Hour
	rand.Read(dead.Fingerprint[:])
	if got, err := s.Acquire(context.Background(), k, dead); got.Record != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v", got, err)
	}
	later := now
	t.Cleanup(func() { now = later })
	now = func() time.Time { return later().Add(2 * time.Minute) }
	return dead
}

func keepClaim() *store.Claim {
	c := claim(time.Minute)
	c.TTL, c.KeepUnknown = time.Hour, true
	return c
}

// holdWriter keeps s's group commit busy until the returned function is
// called, so that the next completion waits in its queue.
func holdWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	entered, done := make(chan struct{}), make(chan struct{})
	go s.db().writes.update(func(*bolt.Tx) error {
		close(entered)
		<-done
		return nil
	})
	<-entered
	return func() { close(done) }
}

// While a dead owner's claim becomes its unknown outcome, other requests
// see the key held, bound as the dead claim was: never free, never bound
// to the request that found it.
func TestKeepUnknownIsAtomic(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k := storetest.NewKey()
	dead := deadClaim(t, s, k)
	release := holdWriter(t, s)
	keep := keepClaim()
	result := make(chan store.Acquired, 1)
	go func() {
		got, err := s.Acquire(ctx, k, keep)
		if err != nil {
			t.Error(err)
		}
		result <- got
	}()
	if !eventually(10*time.Second, func() bool {
		rec, _, _ := s.Lookup(ctx, k)
		return rec != nil && rec.Token == keep.Token
	}) {
		t.Fatal("the claim that found the dead one did not take it within 10s")
	}
	for _, keepToo := range []bool{false, true} {
		other := claim(time.Minute)
		other.KeepUnknown = keepToo
		got, err := s.Acquire(ctx, k, other)
		if rec := got.Record; err != nil || rec == nil || rec.State != store.InProgress || got.TookOver ||
			rec.Endpoint != dead.Endpoint || rec.Fingerprint != dead.Fingerprint {
			t.Fatalf("Acquire (KeepUnknown %v) while the dead claim becomes its unknown outcome = %+v (TookOver %v), %v; want it in progress, bound as the dead claim", keepToo, rec, got.TookOver, err)
		}
	}
	release()
	if got := <-result; got.Record == nil || !got.Record.OutcomeUnknown || !got.TookOver {
		t.Fatalf("Acquire with KeepUnknown = %+v, TookOver %v; want the unknown outcome", got.Record, got.TookOver)
	}
}

// An operator who purges the key while its dead claim becomes the unknown
// outcome has the last word: nothing is written, and the request that
// found the dead claim claims the key afresh.
func TestKeepUnknownPurgedMeanwhile(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k := storetest.NewKey()
	deadClaim(t, s, k)
	release := holdWriter(t, s)
	keep := keepClaim()
	result := make(chan store.Acquired, 1)
	go func() {
		got, err := s.Acquire(ctx, k, keep)
		if err != nil {
			t.Error(err)
		}
		result <- got
	}()
	if !eventually(10*time.Second, func() bool {
		rec, _, _ := s.Lookup(ctx, k)
		return rec != nil && rec.Token == keep.Token
	}) {
		t.Fatal("the claim that found the dead one did not take it within 10s")
	}
	purged := make(chan error, 1)
	go func() {
		_, err := s.Delete(ctx, k)
		purged <- err
	}()
	if !eventually(10*time.Second, func() bool {
		rec, _, _ := s.Lookup(ctx, k)
		return rec == nil
	}) {
		t.Fatal("the purge did not remove the claim within 10s")
	}
	release()
	if err := <-purged; err != nil {
		t.Fatal(err)
	}
	if got := <-result; got.Record != nil || got.TookOver {
		t.Fatalf("Acquire with KeepUnknown, purged meanwhile = %+v, TookOver %v; want a new claim", got.Record, got.TookOver)
	}
	if n := keysInFile(t, s); n != 0 {
		t.Fatalf("%d records in the file after the purge, want none", n)
	}
}

// If the unknown outcome's write fails (here its transaction fails, as a
// full disk would fail it), Acquire fails as the store's outage does, and
// the key stays bound as the dead claim was; once the lease of the claim
// that found it has passed, the next retry makes the unknown outcome.
func TestKeepUnknownWriteFails(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k := storetest.NewKey()
	dead := deadClaim(t, s, k)
	release := holdWriter(t, s)
	keep := keepClaim()
	failed := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, k, keep)
		failed <- err
	}()
	queued := func(n int) bool {
		g := &s.db().writes
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queue) == n
	}
	if !eventually(10*time.Second, func() bool { return queued(1) }) {
		t.Fatal("the unknown outcome's write was not queued within 10s")
	}
	go s.db().writes.update(func(*bolt.Tx) error { panic("no space left on device") })
	if !eventually(10*time.Second, func() bool { return queued(2) }) {
		t.Fatal("the failing write was not queued within 10s")
	}
	release()
	if err := <-failed; !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with KeepUnknown whose write failed = %v; want ErrUnavailable", err)
	}
	rec, _, err := s.Lookup(ctx, k)
	if err != nil || rec == nil || rec.State != store.InProgress || rec.Token != keep.Token ||
		rec.Endpoint != dead.Endpoint || rec.Fingerprint != dead.Fingerprint {
		t.Fatalf("the key after the failed write = %+v, %v; want it claimed, bound as the dead claim", rec, err)
	}

	later := now
	now = func() time.Time { return later().Add(2 * time.Minute) }
	retry := keepClaim()
	got, err := s.Acquire(ctx, k, retry)
	if rec := got.Record; err != nil || rec == nil || !rec.OutcomeUnknown || rec.Token != retry.Token ||
		rec.Endpoint != dead.Endpoint || rec.Fingerprint != dead.Fingerprint || !rec.CreatedAt.Equal(dead.CreatedAt) {
		t.Fatalf("the retry after the failed write = %+v, %v; want the dead claim's unknown outcome", rec, err)
	}
}
