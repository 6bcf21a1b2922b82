package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// provision provisions s as Caddy would and cleans it up after the test.
func provision(t testing.TB, s *Store) *Store {
	t.Helper()
	if err := tryProvision(s); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return s
}

func tryProvision(s *Store) error {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	return s.Provision(ctx)
}

func claim(lease time.Duration) *store.Claim {
	return &store.Claim{Token: storetest.NewToken(), Endpoint: "POST example.com/orders", Lease: lease}
}

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return provision(t, &Store{Path: t.TempDir()}) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return provision(t, &Store{Path: t.TempDir()}) })
}

func TestUnavailableOnceClosed(t *testing.T) {
	s := provision(t, &Store{Path: t.TempDir()})
	s.Cleanup()
	storetest.CheckUnavailable(t, s)
}

func TestDefaultPath(t *testing.T) {
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	provision(t, &Store{})
	if _, err := os.Stat(filepath.Join(data, "caddy", "idempotency", "idempotency.db")); err != nil {
		t.Fatalf("database not in Caddy's data directory: %v", err)
	}
}

// A completed record and an in-progress claim survive closing the file;
// the claim still expires after its lease.
func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := provision(t, &Store{Path: dir})
	done, doneClaim := storetest.NewKey(), claim(time.Minute)
	held, heldClaim := storetest.NewKey(), claim(500*time.Millisecond)
	if _, err := s.Acquire(ctx, done, doneClaim); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, doneClaim, &store.Record{Status: 201, Body: []byte("kept")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, held, heldClaim); err != nil {
		t.Fatal(err)
	}
	s.Cleanup()

	s = provision(t, &Store{Path: dir})
	if rec, err := s.Acquire(ctx, done, claim(time.Minute)); err != nil || rec == nil ||
		rec.State != store.Completed || string(rec.Body) != "kept" || rec.Endpoint != doneClaim.Endpoint {
		t.Fatalf("completed record after reopening = %+v, %v", rec, err)
	}
	if rec, err := s.Acquire(ctx, held, claim(time.Minute)); err != nil || rec == nil || rec.Token != heldClaim.Token {
		t.Fatalf("claim after reopening = %+v, %v; want it still held", rec, err)
	}
	time.Sleep(600 * time.Millisecond)
	if rec, err := s.Acquire(ctx, held, claim(time.Minute)); rec != nil || err != nil {
		t.Fatalf("claim after its lease = %+v, %v; want a takeover", rec, err)
	}
}

// A reload provisions the new config while the old one holds the file: it
// must attach to the open database, not wait for bbolt's lock.
func TestSharedAcrossReloads(t *testing.T) {
	dir := t.TempDir()
	a := provision(t, &Store{Path: dir})
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := a.Acquire(context.Background(), k, c); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b := provision(t, &Store{Path: dir + "/./"})
	if took := time.Since(start); took >= lockTimeout/2 {
		t.Errorf("the second Provision took %v: it waited for the lock", took)
	}
	if a.db != b.db {
		t.Fatal("the same file got a second handle")
	}
	a.Cleanup()
	a.Cleanup() // idempotent
	if rec, err := b.Acquire(context.Background(), k, claim(time.Minute)); err != nil || rec == nil || rec.Token != c.Token {
		t.Fatalf("the new config lost the claim made under the old one: %+v, %v", rec, err)
	}
}

func TestLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	// bbolt's flock is per open file, so a handle of our own stands in for
	// another process.
	other, err := bolt.Open(filepath.Join(dir, "idempotency.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	s := &Store{Path: dir}
	err = tryProvision(s)
	if err == nil || !strings.Contains(err.Error(), "another process holds its lock") {
		t.Fatalf("Provision of a locked file = %v, want a lock error", err)
	}
	if s.Cleanup() != nil {
		t.Fatal("Cleanup after a failed Provision")
	}
}

func TestProvisionErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tryProvision(&Store{Path: file}); err == nil || !strings.Contains(err.Error(), "creating directory") {
		t.Fatalf("Provision under a plain file = %v", err)
	}
	if err := (&Store{}).Validate(); err == nil {
		t.Fatal("Validate passed an unprovisioned store")
	}
}

func TestSweepDeletesExpiredInBatches(t *testing.T) {
	s := provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	put := func(n int, ttl time.Duration) {
		for range n {
			k, c := storetest.NewKey(), claim(time.Minute)
			if _, err := s.Acquire(ctx, k, c); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, k, c, &store.Record{Status: 200}, ttl); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(35, time.Millisecond)
	put(5, time.Hour)
	time.Sleep(5 * time.Millisecond)

	batches := 0
	n, err := s.db.sweep(ctx, 10, func() { batches++ })
	if err != nil || n != 35 {
		t.Fatalf("sweep = %d, %v; want 35", n, err)
	}
	if batches < 4 {
		t.Errorf("35 records deleted in %d transactions of at most 10", batches)
	}
	var left int
	s.db.View(func(tx *bolt.Tx) error {
		left = tx.Bucket(records).Stats().KeyN
		return nil
	})
	if left != 5 {
		t.Fatalf("%d records left, want the 5 live ones", left)
	}
}

func TestSweepStopsWithContext(t *testing.T) {
	s := provision(t, &Store{Path: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.db.sweep(ctx, 10, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("sweep with a done context = %v", err)
	}
}

func BenchmarkAcquireNewKey(b *testing.B) {
	s := provision(b, &Store{Path: b.TempDir()})
	ctx := context.Background()
	c := claim(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if rec, err := s.Acquire(ctx, storetest.NewKey(), c); rec != nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", rec, err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := provision(b, &Store{Path: b.TempDir()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		b.Fatal(err)
	}
	rec := &store.Record{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 4096)}
	if err := s.Complete(ctx, k, c, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got, err := s.Acquire(ctx, k, claim(time.Minute)); got == nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", got, err)
		}
	}
}

// The background sweeper runs on its own and stops with the last user,
// which closes the file.
func TestSweeperRunsAndStops(t *testing.T) {
	defer func(d time.Duration) { sweepInterval = d }(sweepInterval)
	sweepInterval = 20 * time.Millisecond
	s := provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Millisecond)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	keys := func() (n int) {
		s.db.View(func(tx *bolt.Tx) error {
			n = tx.Bucket(records).Stats().KeyN
			return nil
		})
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); keys() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not delete the expired claim within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	db := s.db
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
