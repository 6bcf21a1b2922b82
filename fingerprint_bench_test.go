package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// orderBody is a JSON body of at least size bytes shaped like an API
// order: members in the order a struct marshals them, not sorted, so that
// the canonical form has objects to reorder, strings (one escaped),
// integers and decimals.
func orderBody(size int) []byte {
	type item struct {
		SKU      string  `json:"sku"`
		Name     string  `json:"name"`
		Qty      int     `json:"qty"`
		Price    float64 `json:"price"`
		ClientTS string  `json:"client_ts"`
	}
	type order struct {
		Customer string `json:"customer"`
		Currency string `json:"currency"`
		Note     string `json:"note"`
		Items    []item `json:"items"`
		SentAt   string `json:"sent_at"`
	}
	o := order{Customer: "cus_8f14e45fceea167a", Currency: "EUR", Note: `leave it "at the door"`, SentAt: "2025-01-02T03:04:05Z"}
	for i := 0; ; i++ {
		b, _ := json.Marshal(o)
		if len(b) >= size {
			return b
		}
		o.Items = append(o.Items, item{SKU: "sku-" + strconv.Itoa(i), Name: "Darjeeling first flush", Qty: i%7 + 1,
			Price: float64(i%50) + 0.25, ClientTS: "2025-01-02T03:04:05.123Z"})
	}
}

var fingerprintBenchSizes = []struct {
	name string
	size int
}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}}

var fingerprintBenchModes = []struct {
	name  string
	tweak func(*Handler)
}{
	{"body", nil},
	{"json", func(h *Handler) { h.Fingerprint = fingerprint.JSON }},
	{"json_ignore", func(h *Handler) {
		h.Fingerprint = fingerprint.JSON
		h.FingerprintIgnore = []string{"/sent_at", "/items/*/client_ts"}
	}},
}

func fingerprintBenchHandler(b *testing.B, tweak func(*Handler)) *Handler {
	h := &Handler{Options: app.Options{StoreRaw: json.RawMessage(`{"module":"memory"}`)}}
	if tweak != nil {
		tweak(h)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	return h
}

// BenchmarkFingerprint is the fingerprint alone, per mode and body size.
func BenchmarkFingerprint(b *testing.B) {
	for _, s := range fingerprintBenchSizes {
		body := orderBody(s.size)
		for _, m := range fingerprintBenchModes {
			b.Run(m.name+"/"+s.name, func(b *testing.B) {
				h := fingerprintBenchHandler(b, m.tweak)
				req, _ := http.NewRequest(http.MethodPost, "http://api.example.com/orders?page=1", nil)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					h.payload.Of(req, body)
				}
			})
		}
	}
}

// BenchmarkServeHTTPFingerprint is a whole request on the memory store,
// per mode and body size.
func BenchmarkServeHTTPFingerprint(b *testing.B) {
	for _, s := range fingerprintBenchSizes {
		body := orderBody(s.size)
		request := func(key string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, "http://api.example.com/orders", bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
			caddyhttp.NewTestReplacer(req)
			return req
		}
		for _, m := range fingerprintBenchModes {
			b.Run("memory/"+m.name+"/"+s.name+"/new_key", func(b *testing.B) {
				h := fingerprintBenchHandler(b, m.tweak)
				prefix := strconv.Itoa(int(testSeq.Add(1))) + "-"
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if err := h.ServeHTTP(&discard{h: http.Header{}}, request(prefix+strconv.Itoa(i)), benchUpstream); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("memory/"+m.name+"/"+s.name+"/replay", func(b *testing.B) {
				h := fingerprintBenchHandler(b, m.tweak)
				key := "replay-" + strconv.Itoa(int(testSeq.Add(1)))
				h.ServeHTTP(&discard{h: http.Header{}}, request(key), benchUpstream)
				w := httptest.NewRecorder()
				if h.ServeHTTP(w, request(key), benchUpstream); w.Header().Get("Idempotent-Replayed") != "true" {
					b.Fatalf("not a replay: %d %s", w.Code, w.Body)
				}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if err := h.ServeHTTP(&discard{h: http.Header{}}, request(key), benchUpstream); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
