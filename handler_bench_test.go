package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// discard is a ResponseWriter that costs nothing, so the benchmark measures
// the handler rather than httptest's recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// benchUpstream closes the request body, as reverse_proxy's transport
// does: that hands the handler's buffered body back to its pool.
var benchUpstream = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	r.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, err := w.Write([]byte(`{"order_id":"0f8fad5b-d9cb-469f-a165-70867728950e","status":"created"}`))
	return err
})

func benchStores(b *testing.B) map[string]json.RawMessage {
	srv := testredis.Start(b)
	dsn, _ := json.Marshal(sharedPostgres(b).DSN())
	path, _ := json.Marshal(b.TempDir())
	return map[string]json.RawMessage{
		"memory": json.RawMessage(`{"module":"memory"}`),
		"redis":  json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`),
		// The tier takes records once its subscription is up, a few
		// milliseconds into the replay benchmark.
		"redis_cached": json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"],"local_cache":67108864}`),
		"postgres":     json.RawMessage(`{"module":"postgres","dsn":` + string(dsn) + `,"table":"idem_bench"}`),
		"file":         json.RawMessage(`{"module":"file","path":` + string(path) + `}`),
	}
}

func benchHandler(b *testing.B, raw json.RawMessage) *Handler {
	h := &Handler{Options: app.Options{StoreRaw: raw}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	// The default scope expands to nothing here, which the handler warns
	// about once per handler: on stdout, between the benchmark's results.
	h.logger = zap.NewNop()
	return h
}

// benchRequest is a request as Caddy's server hands it over: with a
// replacer holding the HTTP placeholders.
func benchRequest(key string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, "http://api.example.com/orders", strings.NewReader(`{"sku":"tea","qty":1}`))
	req.ContentLength = 21
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	caddyhttp.NewTestReplacer(req)
	return req
}

func BenchmarkServeHTTP(b *testing.B) {
	for name, raw := range benchStores(b) {
		b.Run(name+"/new_key", func(b *testing.B) {
			h := benchHandler(b, raw)
			prefix := strconv.Itoa(int(testSeq.Add(1))) + "-"
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				req := benchRequest(prefix + strconv.Itoa(i))
				if err := h.ServeHTTP(&discard{h: http.Header{}}, req, benchUpstream); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/replay", func(b *testing.B) {
			h := benchHandler(b, raw)
			key := "replay-" + strconv.Itoa(int(testSeq.Add(1)))
			h.ServeHTTP(&discard{h: http.Header{}}, benchRequest(key), benchUpstream)
			b.ReportAllocs()
			for b.Loop() {
				if err := h.ServeHTTP(&discard{h: http.Header{}}, benchRequest(key), benchUpstream); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// The cost of building the request itself, to subtract from the above.
	b.Run("request_only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchRequest("k")
		}
	})
}
