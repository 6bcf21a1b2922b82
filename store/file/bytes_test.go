package file

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// Any bytes in the endpoint and the response's headers round-trip
// (go test -fuzz FuzzBytes for more than the seeds).
func FuzzBytes(f *testing.F) {
	storetest.FuzzBytes(f, storetest.Provision(f, &Store{Path: f.TempDir()}))
}
