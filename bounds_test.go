package idempotency

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// A memory store too small for the responses its handler keeps would
// evict everything for one of them and lose it anyway: the config is
// refused, whether the handler or the global option gives the store.
func TestMemoryTooSmallForResponsesRefused(t *testing.T) {
	small := "store memory {\n\t\t\tmax_bytes 256KiB\n\t\t}"
	for name, cfg := range map[string]string{
		"site":   "{\n\tadmin off\n}\n:9712 {\n\tidempotency {\n\t\t" + small + "\n\t}\n\trespond ok\n}\n",
		"global": "{\n\tadmin off\n\tidempotency {\n\t\t" + small + "\n\t}\n}\n:9712 {\n\tidempotency\n\trespond ok\n}\n",
	} {
		err := validateCaddyfile(t, cfg)
		if err == nil || !strings.Contains(err.Error(), "max_bytes") || !strings.Contains(err.Error(), "max_response_body") {
			t.Errorf("%s: error %v, want one naming max_bytes and max_response_body", name, err)
		}
	}
	fits := "{\n\tadmin off\n}\n:9712 {\n\tidempotency {\n\t\t" + small + "\n\t\tmax_response_body 32KiB\n\t}\n\trespond ok\n}\n"
	if err := validateCaddyfile(t, fits); err != nil {
		t.Errorf("a store that holds the responses: %v", err)
	}
}

// A record keeps a bounded form of a long endpoint: its size does not grow
// with the path, so that no client pushes out other callers' records with
// long paths, and the same long endpoint still replays while one that
// differs only at its end is another use of the key.
func TestLongEndpointKeptBounded(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h, name := provisionNamed(t, raw, nil)
		ins := storetest.Registered(name).(store.Inspector)
		b := &backend{}
		record := func(path, key string) *store.Record {
			t.Helper()
			wantStatus(t, do(h, b, post(path, key, "x")), 201)
			rec, _, err := ins.Lookup(context.Background(), store.NewKey("", key))
			if err != nil || rec == nil {
				t.Fatalf("Lookup(%s) = %v, %v", key, rec, err)
			}
			return rec
		}
		kib := record("/orders/"+strings.Repeat("a", 1<<10), "k1")
		long := record("/orders/"+strings.Repeat("a", 64<<10), "k2")
		if n, m := len(store.AppendRecord(nil, kib)), len(store.AppendRecord(nil, long)); n != m || len(long.Endpoint) > 512 {
			t.Fatalf("records of %d and %d bytes for paths of 1 and 64 KiB, endpoint kept in %d bytes; want one size, the endpoint within 512",
				n, m, len(long.Endpoint))
		}
		if !strings.HasPrefix(long.Endpoint, "POST api.example.com/orders/aaa") {
			t.Fatalf("endpoint kept as %.60q…, want it to start as the request's", long.Endpoint)
		}

		path := "/orders/" + strings.Repeat("b", 64<<10)
		record(path+"x", "k3")
		r := do(h, b, post(path+"x", "k3", "x"))
		wantStatus(t, r, 201)
		if got := r.placeholder("http.idempotency.result"); got != "replay" {
			t.Fatalf("the same long endpoint: result %q, want replay", got)
		}
		wantProblem(t, do(h, b, post(path+"y", "k3", "x")), 422, "Idempotency-Key is already used")
		if n := b.runs.Load(); n != 3 {
			t.Fatalf("backend ran %d times, want 3", n)
		}
	})
}
