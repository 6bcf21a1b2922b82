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
	for _, s := range benchSizes {
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
