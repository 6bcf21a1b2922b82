package memory

import (
	"bytes"
	"context"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Memory{}) })
	storetest.RunTakeover(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Memory{}) })
}

// A replay is the response as it was completed, whatever the caller did
// to its own header map and body afterwards: the blob holds a copy.
func TestReplayIsExact(t *testing.T) {
	m := storetest.Provision(t, &Memory{})
	ctx := context.Background()
	k, c := acquire(t, m, "POST api.example.com/orders")
	hdr := http.Header{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"a=1", "b=2"},
		"X-Empty":      {""},
	}
	body := []byte(`{"id":1}`)
	if err := m.Complete(ctx, k, c, &store.Response{Status: 201, Header: hdr, Body: body}, time.Hour); err != nil {
		t.Fatal(err)
	}
	want := hdr.Clone()
	hdr["Content-Type"][0] = "text/plain"
	hdr.Del("Set-Cookie")
	body[0] = 'X'

	acq, err := m.Acquire(ctx, k, &store.Claim{Token: storetest.NewToken(), Lease: time.Minute})
	got := acq.Record
	if err != nil || got == nil {
		t.Fatalf("Acquire = %v, %v; want the record", got, err)
	}
	if got.State != store.Completed || got.Status != 201 || got.Truncated ||
		got.Token != c.Token || got.Endpoint != c.Endpoint || got.Fingerprint != c.Fingerprint ||
		!got.CreatedAt.Equal(c.CreatedAt) {
		t.Fatalf("replayed record %+v does not match the claim %+v", got, c)
	}
	if !reflect.DeepEqual(got.Header, want) || !bytes.Equal(got.Body, []byte(`{"id":1}`)) {
		t.Fatalf("replayed %v %q, want %v %q", got.Header, got.Body, want, `{"id":1}`)
	}
}
