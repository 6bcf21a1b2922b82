package file

import (
	"context"
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// Versions before claims were kept in memory wrote them to the file. One
// left there by a process that died holds its key until its lease passes,
// as it did then, and the Inspector sees it; then it is taken over, and
// the takeover reported. Completed records read as ever.
func TestClaimLeftByAnOlderVersion(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	const lease = 500 * time.Millisecond
	t0 := time.Now()
	k, old := storetest.NewKey(), claim(lease)
	done, doneClaim := storetest.NewKey(), claim(time.Minute)
	doneClaim.CreatedAt = t0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		if err := b.Put(k[:], store.AppendClaim(expiry(t0.Add(lease)), old, t0)); err != nil {
			return err
		}
		return b.Put(done[:], store.AppendCompleted(expiry(t0.Add(time.Hour)), doneClaim, &store.Record{Status: 201, Body: []byte("old")}))
	})
	if err != nil {
		t.Fatal(err)
	}

	if rec, err := s.Acquire(ctx, done, claim(time.Minute)); err != nil || rec == nil || rec.State != store.Completed || string(rec.Body) != "old" {
		t.Fatalf("completed record of an older version = %+v, %v", rec, err)
	}
	if rec, err := s.Acquire(ctx, k, claim(time.Minute)); err != nil || rec == nil || rec.State != store.InProgress || rec.Token != old.Token {
		t.Fatalf("Acquire of a key claimed in the file = %+v, %v; want that claim", rec, err)
	}
	if rec, exp, err := s.Lookup(ctx, k); err != nil || rec == nil || rec.Token != old.Token || !exp.Equal(time.Unix(0, t0.Add(lease).UnixNano())) {
		t.Fatalf("Lookup of the claim in the file = %+v, %v, %v", rec, exp, err)
	}
	if got, err := s.InFlight(ctx, 0, 10); err != nil || len(got) != 1 || got[0].Key != k {
		t.Fatalf("InFlight = %+v, %v; want the claim in the file", got, err)
	}
	// Its owner died with the older version: no request here holds it.
	if err := s.Renew(ctx, k, old.Token, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Renew of the claim in the file = %v, want ErrNotOwner", err)
	}

	time.Sleep(time.Until(t0.Add(lease + 100*time.Millisecond)))
	c := claim(time.Minute)
	if rec, err := s.Acquire(ctx, k, c); rec != nil || err != nil || !c.TookOver {
		t.Fatalf("Acquire after the lease = %+v, %v, TookOver %v; want a takeover", rec, err, c.TookOver)
	}
	if err := s.Complete(ctx, k, c, &store.Record{Status: 200, Body: []byte("new")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Acquire(ctx, k, claim(time.Minute)); err != nil || rec == nil || string(rec.Body) != "new" {
		t.Fatalf("record after the takeover = %+v, %v", rec, err)
	}
}
