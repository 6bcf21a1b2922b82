package idempotency

import (
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// Reading the key from a JSON body costs in line with the body: a
// megabyte of JSON is not decoded into a tree of interfaces, whether or
// not it holds the key. The buffered body itself grows by doubling, so it
// costs up to twice its size.
func TestKeyFromJSONCostsInLineWithTheBody(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.KeyFrom = &app.KeyFrom{JSON: "/id"} })
	// The next handler leaves the body unread: what is counted is the handler's.
	b := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(http.StatusCreated); return nil })
	items := strings.TrimSuffix(strings.Repeat(`1,`, 500_000), ",")
	for _, body := range []string{
		`{"items":[` + items + `]}`,
		`{"id":"order-1","items":[` + items + `]}`,
	} {
		do(h, b, post("/orders", "", body)) // warm the pools
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := do(h, b, post("/orders", "", body))
		runtime.ReadMemStats(&after)
		wantStatus(t, r, http.StatusCreated)
		bytesPerBody := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(body))
		allocs := after.Mallocs - before.Mallocs
		t.Logf("body of %d bytes (key %v): %.1f bytes allocated per body byte, %d allocations",
			len(body), strings.Contains(body, `"id"`), bytesPerBody, allocs)
		if bytesPerBody > 3 || allocs > 1000 {
			t.Errorf("a body of %d bytes cost %.1f times its size in %d allocations; want at most 3 times, in at most 1000",
				len(body), bytesPerBody, allocs)
		}
	}
}
