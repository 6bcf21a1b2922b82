package canonjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"testing"
)

// apiBody builds a request body of about size bytes shaped like a JSON API
// order: nested objects, strings (some escaped), integers and decimals,
// arrays of objects, with keys in the order a struct marshals them, not
// sorted.
func apiBody(size int) []byte {
	type address struct {
		Street  string `json:"street"`
		City    string `json:"city"`
		Zip     string `json:"zip"`
		Country string `json:"country"`
	}
	type item struct {
		SKU        string    `json:"sku"`
		Name       string    `json:"name"`
		Quantity   int       `json:"quantity"`
		UnitPrice  float64   `json:"unit_price"`
		Tags       []string  `json:"tags"`
		Dimensions []float64 `json:"dimensions"`
		ClientTS   string    `json:"client_ts"`
	}
	type order struct {
		ID       string `json:"id"`
		Customer struct {
			ID      int64   `json:"id"`
			Email   string  `json:"email"`
			Name    string  `json:"name"`
			Address address `json:"address"`
		} `json:"customer"`
		Currency string            `json:"currency"`
		Items    []item            `json:"items"`
		Note     string            `json:"note"`
		Metadata map[string]string `json:"metadata"`
		SentAt   string            `json:"sent_at"`
	}
	var o order
	o.ID = "ord_8f14e45fceea167a5a36dedd4bea2543"
	o.Customer.ID = 4815162342
	o.Customer.Email = "zoë.müller@example.com"
	o.Customer.Name = "Zoë Müller"
	o.Customer.Address = address{"Rue de l'Église 7", "Genève", "1204", "CH"}
	o.Currency = "CHF"
	o.Note = "Leave at the door <please> & ring \"twice\"\n"
	o.Metadata = map[string]string{"source": "ios-app/5.2.1", "campaign": "spring", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
	o.SentAt = "2025-03-14T15:09:26.535Z"
	for i := 0; ; i++ {
		body, err := json.Marshal(o)
		if err != nil {
			panic(err)
		}
		if len(body) >= size {
			return body
		}
		o.Items = append(o.Items, item{
			SKU:        fmt.Sprintf("SKU-%06d", i*7919%1000000),
			Name:       fmt.Sprintf("Organic green tea, %d g", 50+i%5*50),
			Quantity:   1 + i%4,
			UnitPrice:  float64(100+i*37%5000) / 100,
			Tags:       []string{"tea", "organic", "fair-trade"}[:1+i%3],
			Dimensions: []float64{10.5, 20, 3.25 + float64(i%7)},
			ClientTS:   fmt.Sprintf("2025-03-14T15:09:%02d.%03dZ", i%60, i*13%1000),
		})
	}
}

var benchSizes = []struct {
	name string
	body []byte
}{{"1KiB", apiBody(1 << 10)}, {"64KiB", apiBody(64 << 10)}}

func BenchmarkCanonical(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(int64(len(s.body)))
			b.ReportAllocs()
			dst, ok := Append(nil, s.body, nil)
			if !ok {
				b.Fatal("not JSON")
			}
			for b.Loop() {
				dst, _ = Append(dst[:0], s.body, nil)
			}
		})
	}
}

func BenchmarkCanonicalIgnore(b *testing.B) {
	ign, err := Compile([]string{"/sent_at", "/metadata/trace_id", "/items/*/client_ts"})
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(int64(len(s.body)))
			b.ReportAllocs()
			dst, ok := Append(nil, s.body, ign)
			if !ok || bytes.Contains(dst, []byte("client_ts")) {
				b.Fatal("client_ts not left out")
			}
			for b.Loop() {
				dst, _ = Append(dst[:0], s.body, ign)
			}
		})
	}
}

// BenchmarkRawSHA256 is what fingerprinting a body costs today.
func BenchmarkRawSHA256(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(int64(len(s.body)))
			b.ReportAllocs()
			h := sha256.New()
			var sum [sha256.Size]byte
			for b.Loop() {
				h.Reset()
				h.Write(s.body)
				h.Sum(sum[:0])
			}
		})
	}
}

func BenchmarkCanonicalSHA256(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(int64(len(s.body)))
			b.ReportAllocs()
			h := sha256.New()
			var sum [sha256.Size]byte
			for b.Loop() {
				h.Reset()
				if !Write(h, s.body, nil) {
					b.Fatal("not JSON")
				}
				h.Sum(sum[:0])
			}
		})
	}
}
