package file

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// caddy validate provisions the config in a process of its own, while the
// running Caddy holds the file's lock (issue 35, defect 15): Provision must
// not need the lock. The store it provisions touches nothing and answers
// as unavailable, saying why, until the other process lets go; then it
// opens the file, with the claims that process left.
func TestProvisionWhileAnotherProcessHoldsTheLock(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	first := storetest.Provision(t, &Store{Path: dir})
	k, c := storetest.NewKey(), claim(time.Hour)
	if _, err := first.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	first.Cleanup() // its claim stays in the journal
	// bbolt's flock is per open file, so a handle of our own stands in for
	// another process.
	other, err := bolt.Open(filepath.Join(dir, fileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	s := &Store{Path: dir}
	if err := tryProvision(s); err != nil {
		t.Fatalf("Provision while another process holds the file's lock = %v, want it provisioned (caddy validate beside a running Caddy)", err)
	}
	t.Cleanup(func() { s.Cleanup() })
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	_, err = s.Acquire(ctx, k, claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "another process holds its lock") {
		t.Fatalf("Acquire while another process holds the lock = %v, want ErrUnavailable naming the lock", err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, k, claim(time.Minute))
	if err != nil || got.Record == nil || got.Record.Token != c.Token {
		t.Fatalf("Acquire once the other process let go = %+v, %v; want the claim the journal kept", got, err)
	}
}

func TestSweepDeletesExpiredInBatches(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	put := func(n int, ttl time.Duration) {
		for range n {
			k, c := storetest.NewKey(), claim(time.Minute)
			if _, err := s.Acquire(ctx, k, c); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, ttl); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(35, time.Millisecond)
	put(5, time.Hour)
	time.Sleep(5 * time.Millisecond)

	batches := 0
	n, err := s.db().sweep(ctx, 10, func() { batches++ })
	if err != nil || n != 35 {
		t.Fatalf("sweep = %d, %v; want 35", n, err)
	}
	if batches < 4 {
		t.Errorf("35 records deleted in %d transactions of at most 10", batches)
	}
	var left int
	s.db().View(func(tx *bolt.Tx) error {
		left = tx.Bucket(records).Stats().KeyN
		return nil
	})
	if left != 5 {
		t.Fatalf("%d records left, want the 5 live ones", left)
	}
}

func TestSweepStopsWithContext(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.db().sweep(ctx, 10, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("sweep with a done context = %v", err)
	}
}

// The background sweeper runs on its own, on the file and the claims in
// memory (a dead owner's, past its lease and TTL), and stops with the last
// user, which closes the file.
func TestSweeperRunsAndStops(t *testing.T) {
	defer func(d time.Duration) { sweepInterval = d }(sweepInterval)
	sweepInterval = 20 * time.Millisecond
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	dead := claim(time.Millisecond)
	dead.TTL = time.Millisecond // kept so long past its lease
	if _, err := s.Acquire(ctx, storetest.NewKey(), dead); err != nil {
		t.Fatal(err)
	}
	left := func() (n int) {
		s.db().View(func(tx *bolt.Tx) error {
			n = tx.Bucket(records).Stats().KeyN
			return nil
		})
		s.db().claims.mu.Lock()
		defer s.db().claims.mu.Unlock()
		return n + len(s.db().claims.byKey)
	}
	for deadline := time.Now().Add(10 * time.Second); left() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not delete the expired record and claim within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	db := s.db()
	s.Cleanup()
	select {
	case <-db.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the sweeper still runs after Cleanup")
	}
	if err := db.View(func(*bolt.Tx) error { return nil }); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Fatalf("the file is still open after the last Cleanup: %v", err)
	}
}
