package file

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Store{Path: t.TempDir()}) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Store{Path: t.TempDir()}) })
}

// A completed record and an in-progress claim survive closing the file;
// the claim still expires after its lease.
func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := storetest.Provision(t, &Store{Path: dir})
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

	s = storetest.Provision(t, &Store{Path: dir})
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

func BenchmarkAcquireNewKey(b *testing.B) {
	s := storetest.Provision(b, &Store{Path: b.TempDir()})
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
	s := storetest.Provision(b, &Store{Path: b.TempDir()})
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
