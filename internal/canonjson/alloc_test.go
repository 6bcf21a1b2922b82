//go:build !race

package canonjson

import (
	"crypto/sha256"
	"testing"
)

// The race detector makes sync.Pool drop items at random, so allocations
// are only counted without it.
func TestNoAllocations(t *testing.T) {
	ign := mustCompile(t, "/sent_at", "/items/*/client_ts", "/items/1")
	h := sha256.New()
	odd := struct {
		name string
		body []byte
	}{"escapes, big exponents, a large object", []byte(`{"z":"caf\u00e9 \ud83d\ude00 \ud800","n":[1e99999999999999999999,-0.5e-99999999999999999999],` +
		`"o":{"q":1,"p":2,"o":3,"n":4,"m":5,"l":6,"k":7,"j":8,"i":9,"h":10,"g":11,"f":12,"e":13,"d":14,"c":15,"b":16,"a":17},"sent_at":0}`)}
	for _, s := range append(benchSizes, odd) {
		dst := make([]byte, 0, 4*len(s.body))
		for _, ig := range []*Ignore{nil, ign} {
			if n := testing.AllocsPerRun(50, func() { Append(dst, s.body, ig) }); n != 0 {
				t.Errorf("%s: Append allocates %v times a call", s.name, n)
			}
			if n := testing.AllocsPerRun(50, func() { Write(h, s.body, ig) }); n != 0 {
				t.Errorf("%s: Write allocates %v times a call", s.name, n)
			}
		}
	}
}
