package file

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// deadChildDir, when set, makes TestDeadClaimsKeptPastTheSweep act as the
// child process it starts.
const deadChildDir = "IDEMPOTENCY_FILE_TEST_DEAD_CHILD_DIR"

// The claims of a killed process are kept, once their lease has passed,
// as long again as their TTL (Claim.TTL), whatever sweeps run meanwhile
// (issue 35): a retry within the TTL takes the dead owner's claim over, as
// such, and with KeepUnknown is answered as its unknown outcome rather
// than run again. Past lease and TTL, the claim is gone, from memory and
// from the journal.
func TestDeadClaimsKeptPastTheSweep(t *testing.T) {
	if dir := os.Getenv(deadChildDir); dir != "" {
		runDeadChild(t, dir)
		return
	}
	dir := t.TempDir()
	line := killChild(t, "TestDeadClaimsKeptPastTheSweep", deadChildDir+"="+dir)
	var before, after, kept, gone store.Key
	var fingerprint store.Fingerprint
	if err := parseLine(line, before[:], after[:], kept[:], gone[:], fingerprint[:]); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	defer func(f func() time.Time) { now = f }(now)
	acquire := func(k store.Key, keep bool) (*store.Claim, store.Acquired) {
		t.Helper()
		c := claim(time.Minute)
		c.TTL, c.KeepUnknown = time.Hour, keep
		got, err := s.Acquire(ctx, k, c)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return c, got
	}

	// Two minutes on: every lease (a minute) has passed, no TTL (an hour).
	now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	if _, got := acquire(before, false); got.Record != nil || !got.TookOver {
		t.Fatalf("before any sweep: Acquire = %+v; want a claim that took the dead one over", got)
	}
	if err := s.db().claims.sweep(now()); err != nil {
		t.Fatal(err)
	}
	if _, got := acquire(after, false); got.Record != nil || !got.TookOver {
		t.Errorf("after the sweep: Acquire = %+v, TookOver %v; want a claim that took the dead one over", got.Record, got.TookOver)
	}
	c, got := acquire(kept, true)
	switch rec := got.Record; {
	case rec == nil || !got.TookOver:
		t.Fatalf("after the sweep: Acquire with KeepUnknown = %+v, TookOver %v; want the dead claim's unknown outcome", rec, got.TookOver)
	case rec.State != store.Completed || !rec.OutcomeUnknown || rec.Token != c.Token:
		t.Fatalf("after the sweep: Acquire with KeepUnknown = %+v; want a completed unknown outcome under the new token", rec)
	case rec.Endpoint != deadEndpoint || rec.Fingerprint != fingerprint:
		t.Fatalf("after the sweep: the unknown outcome is bound to %q %x; want the dead claim's %q %x", rec.Endpoint, rec.Fingerprint[:4], deadEndpoint, fingerprint[:4])
	}

	// Past lease and TTL: the last dead claim is forgotten, by the sweep
	// and in the journal.
	now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if err := s.db().claims.sweep(now()); err != nil {
		t.Fatal(err)
	}
	if got := journalClaims(t, s); got[gone] != nil {
		t.Fatal("the journal keeps the dead claim past its lease and TTL")
	}
	if _, got := acquire(gone, true); got.Record != nil || got.TookOver {
		t.Fatalf("past lease and TTL: Acquire = %+v, TookOver %v; want a new claim", got.Record, got.TookOver)
	}
}

// deadEndpoint is what the child's claims were made for.
const deadEndpoint = "POST example.com/payments"

// runDeadChild claims four keys, each for a minute and a TTL of an hour,
// reports them and the claims' fingerprint, then waits to be killed.
func runDeadChild(t *testing.T, dir string) {
	s := storetest.Provision(t, &Store{Path: dir})
	var fingerprint store.Fingerprint
	rand.Read(fingerprint[:])
	keys := make([]store.Key, 4)
	for i := range keys {
		keys[i] = storetest.NewKey()
		c := claim(time.Minute)
		c.Endpoint, c.Fingerprint, c.TTL = deadEndpoint, fingerprint, time.Hour
		if got, err := s.Acquire(context.Background(), keys[i], c); got.Record != nil || err != nil {
			t.Fatalf("Acquire = %+v, %v", got, err)
		}
	}
	fmt.Printf("READY %x %x %x %x %x\n", keys[0][:], keys[1][:], keys[2][:], keys[3][:], fingerprint[:])
	for {
		time.Sleep(time.Hour)
	}
}

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
