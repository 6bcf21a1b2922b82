package file

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing"
	"time"

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
