package file

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// claimsChildDir, when set, makes TestClaimsSurviveSIGKILL act as the
// child process it starts.
const claimsChildDir = "IDEMPOTENCY_FILE_TEST_CLAIMS_CHILD_DIR"

// The claims of a process killed by SIGKILL hold their keys in the next
// process on the same file: in progress while the dead owner's lease
// lasts, then taken over (reported as such, so that on_unknown_outcome
// keep does not run the request again). A renewal and a release count; a
// completion committed to the file wins over its claim, even if the
// process died before it could drop the claim.
func TestClaimsSurviveSIGKILL(t *testing.T) {
	if dir := os.Getenv(claimsChildDir); dir != "" {
		runClaimsChild(t, dir)
		return
	}
	dir := t.TempDir()
	line := killChild(t, "TestClaimsSurviveSIGKILL", claimsChildDir+"="+dir)
	var held, renewed, released, committed store.Key
	var heldBy, renewedBy, committedBy store.Token
	if err := parseLine(line, held[:], heldBy[:], renewed[:], renewedBy[:], released[:], committed[:], committedBy[:]); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}

	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	inProgress := func(what string, k store.Key, owner store.Token) {
		t.Helper()
		got, err := s.Acquire(ctx, k, claim(time.Minute))
		if rec := got.Record; err != nil || rec == nil || rec.State != store.InProgress || rec.Token != owner || got.TookOver {
			t.Fatalf("%s after SIGKILL = %+v (TookOver %v), %v; want the dead child's claim, in progress", what, rec, got.TookOver, err)
		}
	}
	completedBy := func(what string, k store.Key, owner store.Token) {
		t.Helper()
		got, err := s.Acquire(ctx, k, claim(time.Minute))
		if rec := got.Record; err != nil || rec == nil || rec.State != store.Completed || rec.Token != owner {
			t.Fatalf("%s after SIGKILL = %+v, %v; want the completed record", what, rec, err)
		}
	}
	inProgress("the held key", held, heldBy)
	inProgress("the renewed key", renewed, renewedBy)
	if got, err := s.Acquire(ctx, released, claim(time.Minute)); got.Record != nil || err != nil || got.TookOver {
		t.Fatalf("the released key after SIGKILL = %+v, %v; want a new claim, no takeover", got, err)
	}
	completedBy("the key completed before its claim was dropped", committed, committedBy)
	if rec, _, err := s.Lookup(ctx, committed); err != nil || rec == nil || rec.State != store.Completed {
		t.Fatalf("Lookup of the completed key = %+v, %v; want the completed record", rec, err)
	}
	entries, err := s.InFlight(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[store.Key]bool{}
	for _, e := range entries {
		listed[e.Key] = true
	}
	if !listed[held] || !listed[renewed] || listed[committed] || len(entries) != 3 {
		t.Fatalf("InFlight after SIGKILL lists %d claims (held %v, renewed %v, completed %v); want the held, renewed and new released ones",
			len(entries), listed[held], listed[renewed], listed[committed])
	}

	// Two minutes on: the held key's minute has passed, the renewed key's
	// hour has not.
	defer func(f func() time.Time) { now = f }(now)
	now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	if got, err := s.Acquire(ctx, held, claim(time.Minute)); got.Record != nil || err != nil || !got.TookOver {
		t.Fatalf("the held key after its lease = %+v, %v; want a claim that took the dead child's over", got, err)
	}
	inProgress("the renewed key, past its first lease", renewed, renewedBy)
	completedBy("the completed key, past its claim's lease", committed, committedBy)
}

// runClaimsChild leaves claims in every state a killed process can leave
// them, reports them, then waits to be killed.
func runClaimsChild(t *testing.T, dir string) {
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	acquire := func(lease time.Duration) (store.Key, *store.Claim) {
		k, c := storetest.NewKey(), claim(lease)
		if got, err := s.Acquire(ctx, k, c); got.Record != nil || err != nil {
			t.Fatalf("Acquire = %+v, %v", got, err)
		}
		return k, c
	}
	held, heldClaim := acquire(time.Minute)
	renewed, renewedClaim := acquire(time.Minute)
	if err := s.Renew(ctx, renewed, renewedClaim.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	released, releasedClaim := acquire(time.Minute)
	if err := s.Release(ctx, released, releasedClaim.Token); err != nil {
		t.Fatal(err)
	}
	// The completion is committed as Complete commits it, and the process
	// dies before it drops the claim.
	committed, committedClaim := acquire(time.Minute)
	err := s.db().Update(func(tx *bolt.Tx) error {
		return tx.Bucket(records).Put(committed[:], store.AppendCompleted(nil, committedClaim, &store.Response{Status: 201}, now().Add(time.Hour)))
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %x %x %x %x %x %x %x\n", held[:], heldClaim.Token[:], renewed[:], renewedClaim.Token[:],
		released[:], committed[:], committedClaim.Token[:])
	for {
		time.Sleep(time.Hour)
	}
}
