package storetest

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// FuzzBytes checks that s takes any bytes a client or an upstream can
// send, where they end up in a record: the endpoint (the request's path,
// or a template of the client's headers) and the response's header names
// and values. Each input must be stored without an error and come back
// exactly, from the claim in progress and from the completed record.
//
// A backend's tests call it from a Fuzz function of their own; its seeds
// run as a normal test.
func FuzzBytes(f *testing.F, s store.Store) {
	for _, seed := range []struct{ endpoint, name, value string }{
		{"POST example.com/orders", "Content-Type", "application/json"},
		{"POST example.com/a\x00b", "X-Nul", "a\x00b"},
		{"POST example.com/a\xffb", "X-Latin1", "caf\xe9"},
		{"POST example.com/\xed\xa0\x80", "X-Surrogate", "\xed\xa0\x80\\u0000"},
		{"POST example.com/\"\\\n", "X-\xff", "\"\\\t\r\n\x1f\x7f"},
		{"", "", ""},
	} {
		f.Add(seed.endpoint, seed.name, seed.value)
	}
	f.Fuzz(func(t *testing.T, endpoint, name, value string) {
		k := NewKey()
		c := newClaim(time.Minute)
		c.Endpoint = endpoint
		mustAcquire(t, s, k, c)

		claim := mustAcquire(t, s, k, newClaim(time.Minute))
		if claim == nil || claim.State != store.InProgress {
			t.Fatalf("Acquire during the claim = %+v, want the claim in progress", claim)
		}
		if claim.Endpoint != endpoint {
			t.Fatalf("claim's endpoint = %q, want %q", claim.Endpoint, endpoint)
		}

		want := &store.Response{
			Status: 201,
			Header: http.Header{name: {value, value + "2"}, "X-Plain": {"ok"}},
			Body:   []byte(value),
		}
		if err := s.Complete(ctx(t), k, c, want, time.Minute); err != nil {
			t.Fatalf("Complete with header %q: %q: %v", name, value, err)
		}
		got := mustAcquire(t, s, k, newClaim(time.Minute))
		switch {
		case got == nil || got.State != store.Completed:
			t.Fatalf("Acquire after Complete = %+v, want the completed record", got)
		case got.Endpoint != endpoint:
			t.Fatalf("record's endpoint = %q, want %q", got.Endpoint, endpoint)
		case got.Fingerprint != c.Fingerprint || got.Status != 201 || !bytes.Equal(got.Body, want.Body):
			t.Fatalf("record = %+v, want the completed response", got)
		case !reflect.DeepEqual(got.Header, want.Header):
			t.Fatalf("headers = %q, want %q", got.Header, want.Header)
		}
	})
}
