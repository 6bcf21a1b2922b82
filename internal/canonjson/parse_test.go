package canonjson

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// plain8 must agree with the byte table for every byte at every position,
// and for words mixing several.
func TestPlain8(t *testing.T) {
	byteWise := func(w [8]byte) bool {
		for _, c := range w {
			if c >= 0x80 || !plain[c] {
				return false
			}
		}
		return true
	}
	check := func(w [8]byte) {
		if got, want := plain8(binary.LittleEndian.Uint64(w[:])), byteWise(w); got != want {
			t.Fatalf("%q: plain8 says %v, the table %v", w, got, want)
		}
	}
	for c := range 256 {
		for at := range 8 {
			w := [8]byte{'a', 'b', ' ', '~', 'z', '0', '!', '}'}
			w[at] = byte(c)
			check(w)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte{0, 0x1f, ' ', '!', '"', '#', '[', '\\', ']', 0x7f, 0x80, 0xc3, 0xff, 'a'}
	for range 100000 {
		var w [8]byte
		for i := range w {
			w[i] = alphabet[r.IntN(len(alphabet))]
		}
		check(w)
	}
}

// Members sorted by insertion (small objects) and by SortFunc (large ones)
// must come out the same.
func TestLargeObjectOrder(t *testing.T) {
	for _, n := range []int{15, 16, 17, 100} {
		r := rand.New(rand.NewPCG(uint64(n), 3))
		var doc, sorted []byte
		doc = append(doc, '{')
		sorted = append(sorted, '{')
		keys := r.Perm(n)
		for i, k := range keys {
			if i > 0 {
				doc = append(doc, ',')
			}
			// Keys share their first eight bytes, so the prefix ties.
			doc = append(doc, `"prefix__`...)
			doc = append(doc, byte('a'+k/26), byte('a'+k%26))
			doc = append(doc, `":1,"dup":`...)
			doc = append(doc, byte('0'+i%10))
		}
		for k := range n {
			if k > 0 {
				sorted = append(sorted, ',')
			}
			sorted = append(sorted, `"prefix__`...)
			sorted = append(sorted, byte('a'+k/26), byte('a'+k%26))
			sorted = append(sorted, `":1`...)
		}
		for i := range n {
			sorted = append(sorted, `,"dup":`...)
			sorted = append(sorted, byte('0'+i%10))
		}
		doc = append(doc, '}')
		sorted = append(sorted, '}')
		got, want := canonical(t, string(doc), nil), canonical(t, string(sorted), nil)
		if string(got) != string(want) {
			t.Errorf("%d members: %s\ngot  %q\nwant %q", n, doc, got, want)
		}
	}
}
