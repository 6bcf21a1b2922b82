package canonjson

import "encoding/binary"

// Doc is a JSON document read once into its canonical form, whose values
// are then found by JSON pointer: the one reader of the payload
// fingerprint, fingerprint_only and key_from json. Close gives its scratch
// space back; the bytes Values hands out are good until then.
type Doc struct {
	p     *parser
	canon []byte // in canonical order: an object's members sorted by key
}

// Parse reads body, keeping what only keeps (everything when nil); ok is
// false when it is not JSON to this package (see the package doc), and
// Doc is then nil. Values finds what only's pointers match as if nothing
// had been left out.
func Parse(body []byte, only *Ignore) (d *Doc, ok bool) {
	p := getParser(body, only)
	if !p.document() {
		p.release()
		return nil, false
	}
	canon := p.buf
	if p.reordered {
		p.out = p.emit(p.out[:0])
		canon = p.out
	}
	return &Doc{p: p, canon: canon}, true
}

// Close releases d's scratch space.
func (d *Doc) Close() { d.p.release() }

// Values calls visit with the canonical form of every value at pointer, the
// tokens ParsePointer returns, in which * matches every member of an object
// and every element of an array. Members come in key order, elements in
// array order. Of an object's members with one key, the last one counts,
// as in most JSON parsers.
func (d *Doc) Values(pointer []string, visit func(canon []byte)) {
	values(d.canon, pointer, visit)
}

// Member is the string at pointer (no *) in d; ok is false when there is
// none, or the value there is not a string.
func (d *Doc) Member(pointer []string) (s string, ok bool) {
	d.Values(pointer, func(v []byte) {
		if v[0] == tagString {
			n, w := binary.Uvarint(v[1:])
			s, ok = string(v[1+w:1+w+int(n)]), true
		}
	})
	return s, ok
}

// values visits what pointer matches in v, one canonical value.
func values(v []byte, pointer []string, visit func([]byte)) {
	if len(pointer) == 0 {
		visit(v)
		return
	}
	tok, rest := pointer[0], pointer[1:]
	switch v[0] {
	case tagObject:
		for i := 1; v[i] != tagObjectEnd; {
			keyEnd := skip(v, i)
			valEnd := skip(v, keyEnd)
			n, w := binary.Uvarint(v[i+1:])
			key := v[i+1+w : i+1+w+int(n)]
			// Duplicate keys are adjacent, in their order: the last counts.
			last := v[valEnd] == tagObjectEnd || !sameKey(v, valEnd, key)
			if last && (tok == "*" || string(key) == tok) {
				values(v[keyEnd:valEnd], rest, visit)
			}
			i = valEnd
		}
	case tagArray:
		index := arrayIndex(tok)
		for i, at := 1, 0; v[i] != tagArrayEnd; at++ {
			end := skip(v, i)
			if tok == "*" || at == index {
				values(v[i:end], rest, visit)
			}
			i = end
		}
	}
}

// arrayIndex is the element that tok names, as RFC 6901 spells an index
// (digits, no leading zero), or -1.
func arrayIndex(tok string) int {
	if tok == "" || len(tok) > 9 || tok[0] == '0' && tok != "0" {
		return -1
	}
	n := 0
	for _, c := range []byte(tok) {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// sameKey reports whether the key that starts at v[i] is key.
func sameKey(v []byte, i int, key []byte) bool {
	n, w := binary.Uvarint(v[i+1:])
	return string(v[i+1+w:i+1+w+int(n)]) == string(key)
}

// skip returns where the canonical value that starts at v[i] ends.
func skip(v []byte, i int) int {
	switch v[i] {
	case tagNull, tagFalse, tagTrue:
		return i + 1
	case tagString:
		n, w := binary.Uvarint(v[i+1:])
		return i + 1 + w + int(n)
	case tagNumber:
		if v[i+1] == '0' {
			return i + 2
		}
		i += 2 // the tag and the significand's sign
		n, w := binary.Uvarint(v[i:])
		i += w + int(n) + 1 // the digits and the exponent's sign
		n, w = binary.Uvarint(v[i:])
		return i + w + int(n)
	case tagArray:
		i++
		for v[i] != tagArrayEnd {
			i = skip(v, i)
		}
		return i + 1
	default: // tagObject
		i++
		for v[i] != tagObjectEnd {
			i = skip(v, skip(v, i))
		}
		return i + 1
	}
}
