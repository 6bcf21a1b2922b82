package memory

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A completion too large for the store, or for its share of it, fails
// without evicting the other callers' records, and leaves its claim held:
// the retry is not run again while the lease lasts.
func TestOversizedCompletionEvictsNothing(t *testing.T) {
	for _, body := range []int{1 << 20, 100 << 10} {
		t.Run(strconv.Itoa(body), func(t *testing.T) {
			m := storetest.Provision(t, &Memory{MaxBytes: 256 << 10})
			ctx := context.Background()
			var others []store.Key
			for i := range 20 {
				k, c := acquire(t, m, "POST /small/"+strconv.Itoa(i))
				if err := m.Complete(ctx, k, c, &store.Response{Status: 201, Body: make([]byte, 1000)}, time.Hour); err != nil {
					t.Fatal(err)
				}
				others = append(others, k)
			}
			k, c := acquire(t, m, "POST /large")
			err := m.Complete(ctx, k, c, &store.Response{Status: 201, Body: make([]byte, body)}, time.Hour)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("completing %d bytes in a store of 256KiB = %v, want ErrUnavailable", body, err)
			}
			lost := 0
			for _, o := range others {
				if rec, _, _ := m.Lookup(ctx, o); rec == nil {
					lost++
				}
			}
			if lost > 0 {
				t.Errorf("the failed completion evicted %d of the %d other records", lost, len(others))
			}
			got, err := m.Acquire(ctx, k, &store.Claim{Token: storetest.NewToken(), Lease: time.Minute})
			if err != nil || got.Record == nil || got.Record.State != store.InProgress || got.Record.Token != c.Token {
				t.Errorf("after the failed completion, a retry's Acquire = %+v, %v; want the claim, still held", got.Record, err)
			}
			if err := m.tab.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// MaxRecordBytes is what Complete keeps: a record of that size, not one
// byte more.
func TestMaxRecordBytesIsWhatCompleteKeeps(t *testing.T) {
	m := storetest.Provision(t, &Memory{MaxBytes: 256 << 10})
	ctx := context.Background()
	for _, extra := range []int{0, 1} {
		k, c := acquire(t, m, "POST /orders")
		expires := time.Now().Add(time.Hour)
		empty := len(store.AppendCompleted(nil, c, &store.Response{Status: 201}, expires))
		body := make([]byte, int(m.MaxRecordBytes())-empty+extra)
		err := m.Complete(ctx, k, c, &store.Response{Status: 201, Body: body}, time.Hour)
		if (err == nil) != (extra == 0) {
			t.Errorf("a record %d byte(s) over MaxRecordBytes (%d): Complete = %v", extra, m.MaxRecordBytes(), err)
		}
	}
}
