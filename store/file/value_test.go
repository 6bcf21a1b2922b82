package file

import (
	"bytes"
	"context"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A value in the file is the completed record in the shared codec, expiry
// included, and nothing else: what Complete writes decodes whole, and a
// record put there by hand is replayed until its expiry, then swept.
func TestValueIsTheEncodedRecord(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := s.Complete(ctx, k, c, &store.Response{Status: 201, Body: []byte("written")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var v []byte
	s.db().View(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket(records).Get(k[:]))
		return nil
	})
	rec, err := store.DecodeRecord(v)
	switch {
	case err != nil:
		t.Fatalf("the value Complete wrote does not decode: %v", err)
	case rec.State != store.Completed || rec.Token != c.Token || rec.Endpoint != c.Endpoint || string(rec.Body) != "written":
		t.Fatalf("the value Complete wrote = %+v", rec)
	case !rec.CreatedAt.Equal(c.CreatedAt):
		t.Fatalf("CreatedAt = %v, want the claim's %v", rec.CreatedAt, c.CreatedAt)
	case rec.ExpiresAt.Before(before.Add(time.Hour)) || rec.ExpiresAt.After(time.Now().Add(time.Hour)):
		t.Fatalf("ExpiresAt = %v, want an hour after the completion", rec.ExpiresAt)
	}

	kept, gone := storetest.NewKey(), storetest.NewKey()
	kc, gc := claim(time.Minute), claim(time.Minute)
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	err = s.db().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		if err := b.Put(kept[:], store.AppendCompleted(nil, kc, &store.Response{Status: 201, Body: []byte("by hand")}, expires)); err != nil {
			return err
		}
		return b.Put(gone[:], store.AppendCompleted(nil, gc, &store.Response{Status: 200}, time.Now().Add(-time.Second)))
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, kept, claim(time.Minute))
	if rec := got.Record; err != nil || rec == nil || rec.State != store.Completed || rec.Token != kc.Token ||
		string(rec.Body) != "by hand" || !rec.ExpiresAt.Equal(expires) {
		t.Fatalf("Acquire of a record put in the file = %+v, %v", rec, err)
	}
	if rec, exp, err := s.Lookup(ctx, kept); err != nil || rec == nil || !exp.Equal(expires) {
		t.Fatalf("Lookup of a record put in the file = %+v, %v, %v; want its expiry %v", rec, exp, err, expires)
	}
	if got, err := s.Acquire(ctx, gone, claim(time.Minute)); got.Record != nil || err != nil || got.TookOver {
		t.Fatalf("Acquire of an expired record = %+v, %v; want a new claim", got, err)
	}
	if n, err := s.db().sweep(ctx, sweepBatch, nil); n != 1 || err != nil {
		t.Fatalf("sweep = %d, %v; want the expired record deleted", n, err)
	}
}
