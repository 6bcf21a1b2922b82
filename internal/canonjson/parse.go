package canonjson

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"unicode/utf8"
)

// The canonical form is a prefix-free code:
//
//	null, false, true   n, f, t
//	number zero         d 0
//	other number        d, + or -, uvarint length, significand digits,
//	                    + or -, uvarint length, exponent digits
//	string              s, uvarint length, the decoded bytes
//	array               a, each element, ]
//	object              o, each kept member as key (a string) then value, }
//
// Every value starts with a tag naming its type and ends where its tag and
// lengths say. Within an array the next byte is ] or the next element's
// tag, and no value's tag is ]; within an object it is } or the s of the
// next key.
const (
	tagNull      = 'n'
	tagFalse     = 'f'
	tagTrue      = 't'
	tagNumber    = 'd'
	tagString    = 's'
	tagArray     = 'a'
	tagArrayEnd  = ']'
	tagObject    = 'o'
	tagObjectEnd = '}'
)

// parser holds one call's input and scratch space; it is pooled.
type parser struct {
	in    []byte
	pos   int
	depth int
	ign   *Ignore
	path  []step // to the value being read, while ign may match below it

	// buf receives the canonical bytes in the order of the input.
	buf []byte
	// objects lists every object kept, in the order they start.
	objects []object
	// stack holds the members of the objects being read; members receives
	// each object's members, sorted, when the object ends.
	stack   []member
	members []member
	// reordered records that some object's members were not in order, so
	// buf must be rewritten in sorted order.
	reordered bool

	out []byte // the rewritten form, for Write
}

// object is the span of one object in buf and where its sorted members are.
type object struct {
	start, end int32 // buf[start] is tagObject, buf[end-1] tagObjectEnd
	first, n   int32 // members[first : first+n]
	next       int32 // the first object that starts after this one ends
}

// member is the span of one member (key, then value) in buf.
type member struct {
	start, end       int32
	keyStart, keyEnd int32  // the decoded key bytes
	objects          int32  // the first object that can start in the member
	prefix           uint64 // keyPrefix of the key
}

// document reads the whole body as one JSON value.
func (p *parser) document() bool {
	if len(p.in) > MaxLen {
		return false
	}
	p.skipSpace()
	if !p.value(p.ign.start()) {
		return false
	}
	p.skipSpace()
	return p.pos == len(p.in)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		if c := p.in[p.pos]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return
		}
		p.pos++
	}
}

// value reads one value; st is the Ignore state at this value.
func (p *parser) value(st int32) bool {
	if p.pos >= len(p.in) {
		return false
	}
	switch c := p.in[p.pos]; c {
	case '{':
		return p.object(st)
	case '[':
		return p.array(st)
	case '"':
		_, _, ok := p.string()
		return ok
	case 't':
		return p.literal("true", tagTrue)
	case 'f':
		return p.literal("false", tagFalse)
	case 'n':
		return p.literal("null", tagNull)
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return p.number()
		}
		return false
	}
}

func (p *parser) literal(word string, tag byte) bool {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(word)) {
		return false
	}
	p.pos += len(word)
	p.buf = append(p.buf, tag)
	return true
}

// mark is where to roll buf back to when a value turns out to be ignored:
// it is read (it must be valid) and then dropped.
type mark struct{ buf, objects, members int }

func (p *parser) mark() mark {
	return mark{len(p.buf), len(p.objects), len(p.members)}
}

func (p *parser) rollback(m mark) {
	p.buf = p.buf[:m.buf]
	p.objects = p.objects[:m.objects]
	p.members = p.members[:m.members]
}

func (p *parser) object(st int32) bool {
	if p.depth++; p.depth > MaxDepth {
		return false
	}
	o := len(p.objects)
	p.objects = append(p.objects, object{start: int32(len(p.buf))})
	p.buf = append(p.buf, tagObject)
	base := len(p.stack)
	p.pos++
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
	} else {
		for {
			if p.pos >= len(p.in) || p.in[p.pos] != '"' {
				return false
			}
			at := p.mark()
			m := member{start: int32(at.buf), objects: int32(at.objects)}
			ks, ke, ok := p.string()
			if !ok {
				return false
			}
			m.keyStart, m.keyEnd = int32(ks), int32(ke)
			m.prefix = keyPrefix(p.buf[ks:ke])
			p.skipSpace()
			if p.pos >= len(p.in) || p.in[p.pos] != ':' {
				return false
			}
			p.pos++
			p.skipSpace()
			next, drop := p.into(st, step{key: p.buf[ks:ke], index: -1})
			if !p.value(next) {
				return false
			}
			p.leave(st)
			if drop {
				p.rollback(at)
			} else {
				m.end = int32(len(p.buf))
				p.stack = append(p.stack, m)
			}
			if more, ok := p.separator('}'); !ok {
				return false
			} else if !more {
				break
			}
		}
	}
	p.buf = append(p.buf, tagObjectEnd)
	ms := p.stack[base:]
	if p.sortMembers(ms) {
		p.reordered = true
	}
	ob := &p.objects[o]
	ob.end = int32(len(p.buf))
	ob.first = int32(len(p.members))
	ob.n = int32(len(ms))
	ob.next = int32(len(p.objects))
	p.members = append(p.members, ms...)
	p.stack = p.stack[:base]
	p.depth--
	return true
}

// separator reads what follows a member or element: end, which closes
// the container (more is false), or a comma before the next one; ok is
// false for anything else.
func (p *parser) separator(end byte) (more, ok bool) {
	p.skipSpace()
	if p.pos >= len(p.in) {
		return false, false
	}
	switch p.in[p.pos] {
	case end:
		p.pos++
		return false, true
	case ',':
		p.pos++
		p.skipSpace()
		return true, true
	}
	return false, false
}

// into returns the state of the member or element s of a value read in
// state st, and whether it is left out; the path holds s until leave.
func (p *parser) into(st int32, s step) (int32, bool) {
	if st < 0 {
		return st, st == dropped
	}
	p.path = append(p.path, s)
	return p.ign.at(p.path)
}

func (p *parser) leave(st int32) {
	if st >= 0 {
		p.path = p.path[:len(p.path)-1]
	}
}

func (p *parser) array(st int32) bool {
	if p.depth++; p.depth > MaxDepth {
		return false
	}
	p.buf = append(p.buf, tagArray)
	p.pos++
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
	} else {
		for i := 0; ; i++ {
			at := p.mark()
			next, drop := p.into(st, step{index: i})
			if !p.value(next) {
				return false
			}
			p.leave(st)
			if drop {
				p.rollback(at)
				if p.ign.holes(st) {
					p.buf = append(p.buf, tagNull)
				}
			}
			if more, ok := p.separator(']'); !ok {
				return false
			} else if !more {
				break
			}
		}
	}
	p.buf = append(p.buf, tagArrayEnd)
	p.depth--
	return true
}

// plain marks the ASCII bytes that stand for themselves inside a string.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plain8 reports whether eight bytes are all plain. A byte below 0x20
// borrows in x-0x20, a quote or backslash becomes zero and borrows in the
// -0x01 terms, and a byte of 0x80 or more has its top bit set already. A
// borrow can set the top bit of the next byte up too, but only after a
// byte that is not plain.
func plain8(x uint64) bool {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	special := (x - 0x20*ones) | (x ^ '"'*ones - ones) | (x ^ '\\'*ones - ones) | x
	return special&tops == 0
}

// string reads a string and writes it decoded, length-prefixed; start and
// end are the decoded bytes in buf.
func (p *parser) string() (start, end int, ok bool) {
	in := p.in
	first := p.pos + 1
	run, i := first, first // in[run:i] is plain, not yet written
	p.buf = append(p.buf, tagString)
	start = len(p.buf)
	for {
		for i < len(in) {
			if i+8 <= len(in) && plain8(binary.LittleEndian.Uint64(in[i:])) {
				i += 8
			} else if c := in[i]; c < utf8.RuneSelf {
				if !plain[c] {
					break
				}
				i++
			} else if r, size := utf8.DecodeRune(in[i:]); r == utf8.RuneError && size == 1 {
				return 0, 0, false
			} else {
				i += size
			}
		}
		if i >= len(in) {
			return 0, 0, false
		}
		switch in[i] {
		case '"':
			p.pos = i + 1
			if run == first { // no escape: the length is known before the bytes
				p.buf = binary.AppendUvarint(p.buf, uint64(i-run))
				start = len(p.buf)
				p.buf = append(p.buf, in[run:i]...)
				return start, len(p.buf), true
			}
			p.buf = append(p.buf, in[run:i]...)
			start, end = p.prefixLength(start)
			return start, end, true
		case '\\':
			p.buf = append(p.buf, in[run:i]...)
			n, ok := p.escape(in[i:])
			if !ok {
				return 0, 0, false
			}
			i += n
			run = i
		default: // a control character
			return 0, 0, false
		}
	}
}

// unescaped maps the byte after a backslash to what the escape stands for,
// for every escape but \u.
var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escape decodes the escape at the start of s and returns its length.
func (p *parser) escape(s []byte) (n int, ok bool) {
	if len(s) < 2 {
		return 0, false
	}
	if c := unescaped[s[1]]; c != 0 {
		p.buf = append(p.buf, c)
		return 2, true
	}
	if s[1] != 'u' {
		return 0, false
	}
	r, ok := hex4(s[2:])
	if !ok {
		return 0, false
	}
	if r < 0xd800 || r > 0xdfff {
		p.buf = utf8.AppendRune(p.buf, r)
		return 6, true
	}
	if r < 0xdc00 && len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
		if lo, ok := hex4(s[8:]); ok && 0xdc00 <= lo && lo <= 0xdfff {
			p.buf = utf8.AppendRune(p.buf, 0x10000+(r-0xd800)<<10+(lo-0xdc00))
			return 12, true
		}
	}
	// A lone surrogate is written as its generalised UTF-8 (WTF-8) bytes:
	// no valid UTF-8 spells them, and a raw body holding them is refused,
	// so it stays distinct from U+FFFD and every character.
	p.buf = append(p.buf, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
	return 6, true
}

// hex4 reads the four hex digits of a \u escape.
func hex4(s []byte) (rune, bool) {
	var b [2]byte
	if len(s) < 4 {
		return 0, false
	}
	if _, err := hex.Decode(b[:], s[:4]); err != nil {
		return 0, false
	}
	return rune(b[0])<<8 | rune(b[1]), true
}

// prefixLength puts the length of buf[start:] before it, once it is known,
// and returns where the bytes moved.
func (p *parser) prefixLength(start int) (int, int) {
	n := len(p.buf) - start
	var v [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(v[:], uint64(n))
	p.buf = append(p.buf, v[:l]...)
	copy(p.buf[start+l:], p.buf[start:start+n])
	copy(p.buf[start:], v[:l])
	return start + l, start + l + n
}
