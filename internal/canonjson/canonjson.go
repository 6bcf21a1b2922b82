// Package canonjson writes the canonical form of a JSON document, the input
// of a payload fingerprint that survives the ways clients rebuild a request
// when they retry it.
//
// A client that retries often marshals the payload again: members come out
// in another order, with other whitespace, strings escaped another way,
// numbers spelled another way, and a fresh timestamp or trace id. Hashing
// the bytes calls such a retry another payload. The canonical form keeps
// what the document means and drops how it was spelled:
//
//   - members of an object are sorted by their decoded key bytes; the sort
//     is stable, so duplicate keys keep their order ({"a":1,"a":2} is not
//     {"a":2,"a":1}: most parsers keep the last one);
//   - array order counts;
//   - insignificant whitespace does not count;
//   - strings are compared decoded: an escape (\u00e9, \n, \/, a surrogate
//     pair) and the raw UTF-8 it stands for are one string;
//   - numbers are compared exactly as decimals of any length, never through
//     float64: 1, 1.0, 10e-1 and 1E0 are one number, -0 and 0 are one
//     number, 12345678901234567890 and 12345678901234567891 are two;
//   - values of distinct JSON types never compare equal ("1" is not 1);
//   - members and array elements matched by an [Ignore] are left out as if
//     absent.
//
// The output is length-prefixed and tagged so that no two documents that
// differ under these rules produce the same bytes. It is a fingerprint
// input, not JSON: it is not meant for humans and has no stability promise
// across versions of this package beyond equal inputs giving equal bytes.
//
// A body that is not JSON (RFC 8259), an empty body, a string holding
// bytes that are not UTF-8, a body nested deeper than [MaxDepth] or longer
// than [MaxLen] gives ok=false: the caller then fingerprints the raw bytes.
// This package never refuses a body; what is valid is the upstream's
// business. encoding/json accepts bytes that are not UTF-8 inside strings
// and decodes them to U+FFFD, which would make distinct bodies one; this
// package calls such a body not JSON instead. An escaped lone surrogate
// (\ud800) is valid JSON and is kept distinct from U+FFFD and from every
// other string.
//
// One call validates and writes the canonical bytes in one recursive-descent
// pass, without decoding into maps; scratch space is pooled, so a call
// allocates nothing in steady state.
package canonjson

import (
	"io"
	"sync"
)

// MaxDepth is the deepest nesting of arrays and objects that is
// canonicalised; a deeper body is not JSON to this package (ok=false), so
// that no body can exhaust the stack.
const MaxDepth = 1000

// MaxLen is the longest body that is canonicalised; a longer one gives
// ok=false. It keeps every offset into the scratch buffer, which can be a
// few times longer than the body, within 32 bits.
const MaxLen = 1 << 28

// Append appends the canonical form of body to dst, leaving out what ign
// matches (ign may be nil). ok is false, and dst is returned unchanged,
// when body is not JSON; the caller then fingerprints the raw bytes, and
// should mark which of the two it hashed, since raw bytes can spell any
// canonical form.
func Append(dst, body []byte, ign *Ignore) (out []byte, ok bool) {
	p := getParser(body, ign)
	defer p.release()
	if !p.document() {
		return dst, false
	}
	return p.emit(dst), true
}

// Write writes the canonical form of body to w (typically a hash) in one
// Write call, leaving out what ign matches (ign may be nil). It writes
// nothing and returns false when body is not JSON, as [Append] does. An
// error from w is not reported: hashes do not fail.
func Write(w io.Writer, body []byte, ign *Ignore) (ok bool) {
	p := getParser(body, ign)
	defer p.release()
	if !p.document() {
		return false
	}
	out := p.buf
	if p.reordered {
		p.out = p.emit(p.out[:0])
		out = p.out
	}
	w.Write(out)
	return true
}

// poolMax is the largest scratch buffer kept for reuse: one unusually large
// body should not pin its scratch space for the life of the process.
const poolMax = 4 << 20

var parsers = sync.Pool{New: func() any { return new(parser) }}

func getParser(body []byte, ign *Ignore) *parser {
	p := parsers.Get().(*parser)
	p.in = body
	p.ign = ign
	return p
}

func (p *parser) release() {
	clear(p.path) // its keys point into buffers that may be dropped
	*p = parser{
		buf:     trim(p.buf, poolMax),
		out:     trim(p.out, poolMax),
		objects: trim(p.objects, poolMax/32), // a span is at most 32 bytes
		members: trim(p.members, poolMax/32),
		stack:   trim(p.stack, poolMax/32),
		path:    p.path[:0],
	}
	parsers.Put(p)
}

// trim empties s for reuse, or drops it when it can hold more than limit.
func trim[T any](s []T, limit int) []T {
	if cap(s) > limit {
		return nil
	}
	return s[:0]
}
