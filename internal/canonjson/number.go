package canonjson

import (
	"encoding/binary"
	"strconv"
)

// number reads a number and writes it as an exact decimal, significand and
// power of ten: 1, 1.0 and 10e-1 become (1, 0); 100 and 1e2 become (1, 2);
// every zero is the one zero. Digits are copied, never converted, so
// numbers of any length keep every digit.
func (p *parser) number() bool {
	in := p.in
	i := p.pos
	neg := in[i] == '-'
	if neg {
		i++
	}
	intStart := i
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		i = digits(in, i)
	default:
		return false
	}
	intPart := in[intStart:i]
	var frac []byte
	if i < len(in) && in[i] == '.' {
		i++
		start := i
		if i = digits(in, i); i == start {
			return false
		}
		frac = in[start:i]
	}
	expNeg := false
	var exp []byte
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			expNeg = in[i] == '-'
			i++
		}
		start := i
		if i = digits(in, i); i == start {
			return false
		}
		exp = in[start:i]
	}
	p.pos = i
	p.writeNumber(neg, intPart, frac, expNeg, exp)
	return true
}

func digits(in []byte, i int) int {
	for i < len(in) && '0' <= in[i] && in[i] <= '9' {
		i++
	}
	return i
}

// writeNumber writes intPart.frac × 10^exp as tag, sign, significand and
// exponent. The significand is the digits of intPart then frac without the
// leading and trailing zeros; each trailing zero dropped raises the
// exponent by one, and each digit of frac lowers it by one.
func (p *parser) writeNumber(neg bool, intPart, frac []byte, expNeg bool, exp []byte) {
	n := len(intPart) + len(frac)
	at := func(j int) byte {
		if j < len(intPart) {
			return intPart[j]
		}
		return frac[j-len(intPart)]
	}
	lo := 0
	for lo < n && at(lo) == '0' {
		lo++
	}
	if lo == n {
		p.buf = append(p.buf, tagNumber, '0')
		return
	}
	hi := n
	for at(hi-1) == '0' {
		hi--
	}
	sign := byte('+')
	if neg {
		sign = '-'
	}
	p.buf = append(p.buf, tagNumber, sign)
	p.buf = binary.AppendUvarint(p.buf, uint64(hi-lo))
	if lo < len(intPart) {
		p.buf = append(p.buf, intPart[lo:min(hi, len(intPart))]...)
	}
	if hi > len(intPart) {
		p.buf = append(p.buf, frac[max(lo, len(intPart))-len(intPart):hi-len(intPart)]...)
	}
	p.writeExponent(expNeg, exp, int64(n-hi)-int64(len(frac)))
}

// writeExponent writes ±exp + k as a sign ('+' for zero) and length-prefixed
// decimal digits without leading zeros. k is small (its size is bounded by
// the body's length); exp is any number of digits.
func (p *parser) writeExponent(expNeg bool, exp []byte, k int64) {
	for len(exp) > 0 && exp[0] == '0' {
		exp = exp[1:]
	}
	if len(exp) <= 18 {
		var e int64
		for _, c := range exp {
			e = e*10 + int64(c-'0')
		}
		if expNeg {
			e = -e
		}
		e += k
		if e < 0 {
			p.buf = append(p.buf, '-', 0)
			e = -e
		} else {
			p.buf = append(p.buf, '+', 0)
		}
		// At most 19 digits: the length fits the one byte saved for it.
		lenAt := len(p.buf) - 1
		p.buf = strconv.AppendUint(p.buf, uint64(e), 10)
		p.buf[lenAt] = byte(len(p.buf) - lenAt - 1)
		return
	}
	// |exp| ≥ 10^18 dwarfs |k|, so the sign is exp's and the magnitude is
	// |exp| + k for a positive exponent, |exp| - k for a negative one.
	if expNeg {
		p.buf = append(p.buf, '-')
		k = -k
	} else {
		p.buf = append(p.buf, '+')
	}
	start := len(p.buf)
	p.buf = addSmall(p.buf, exp, k)
	p.prefixLength(start)
}

// addSmall appends the decimal digits of d + k, where d has no leading
// zeros and is larger than |k|.
func addSmall(dst, d []byte, k int64) []byte {
	start := len(dst)
	dst = append(append(dst, '0'), d...) // room for a carry
	x := dst[start:]
	for j := len(x) - 1; j >= 0 && k != 0; j-- {
		v := int64(x[j]-'0') + k
		k = v / 10
		if v %= 10; v < 0 {
			v += 10
			k--
		}
		x[j] = '0' + byte(v)
	}
	z := 0
	for z < len(x)-1 && x[z] == '0' {
		z++
	}
	copy(x, x[z:])
	return dst[:len(dst)-z]
}
