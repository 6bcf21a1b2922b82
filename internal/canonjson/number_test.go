package canonjson

import (
	"math/big"
	"strings"
	"testing"
)

// addSmall is the exponent arithmetic for exponents of 19 digits or more;
// big.Int is the reference.
func TestAddSmall(t *testing.T) {
	for _, d := range []string{
		"1000000000000000000", "9999999999999999999", "1000000000000000000000000000",
		"9999999999999999999999999999", "1234567890123456789012", "1000000000000000000000000268435456",
	} {
		for _, k := range []int64{0, 1, -1, 9, -9, 10, -10, 11, 99, -99, 1 << 28, -(1 << 28), 987654321, -987654321} {
			want := new(big.Int)
			want.SetString(d, 10)
			want.Add(want, big.NewInt(k))
			got := addSmall([]byte("x"), []byte(d), k)
			if string(got) != "x"+want.String() {
				t.Errorf("%s + %d: got %s, want %s", d, k, got[1:], want)
			}
		}
	}
}

// The exponent's two paths (int64 up to 18 digits, decimal arithmetic
// beyond) must write one value the same way.
func TestExponentPathsAgree(t *testing.T) {
	for _, c := range [][2]string{
		{"1e1000000000000000000", "10e999999999999999999"},
		{"1e-999999999999999999", "0.1e-999999999999999998"},
		{"1e-1000000000000000000", "0.1e-999999999999999999"},
		{"1e999999999999999999", "0.1e1000000000000000000"},
		{"1e999999999999999998", "0.01e1000000000000000000"},
		{"1" + strings.Repeat("0", 30) + "e-1000000000000000010", "1e-999999999999999980"},
	} {
		a, b := canonical(t, c[0], nil), canonical(t, c[1], nil)
		if string(a) != string(b) {
			t.Errorf("%s and %s differ: %q, %q", c[0], c[1], a, b)
		}
	}
}
