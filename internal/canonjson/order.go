package canonjson

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// Objects are put in canonical order in two steps. While the body is read,
// each object's members are written to buf as they come and their spans
// sorted when the object ends; nothing moves. Then, only if some object
// was out of order, emit copies buf in sorted order, each byte once, so
// that nesting costs no repeated moves.

// compare orders members by key, then by the order they came in, so that
// duplicate keys keep theirs; no two members compare equal.
func (p *parser) compare(a, b *member) int {
	if a.prefix != b.prefix {
		if a.prefix < b.prefix {
			return -1
		}
		return 1
	}
	if c := bytes.Compare(p.buf[a.keyStart:a.keyEnd], p.buf[b.keyStart:b.keyEnd]); c != 0 {
		return c
	}
	return int(a.start - b.start)
}

func (p *parser) less(a, b *member) bool { return p.compare(a, b) < 0 }

// sortMembers sorts one object's members and reports whether they were out
// of order. Most objects are small and come sorted or nearly so, which
// insertion sort does in about one pass, with no comparison called through
// a function value; a large one out of order goes to SortFunc, since
// insertion sort is quadratic.
func (p *parser) sortMembers(ms []member) (moved bool) {
	for i := 1; i < len(ms); i++ {
		if !p.less(&ms[i], &ms[i-1]) {
			continue
		}
		if len(ms) > 16 {
			slices.SortFunc(ms, func(a, b member) int { return p.compare(&a, &b) })
			return true
		}
		m := ms[i]
		j := i
		for ; j > 0 && p.less(&m, &ms[j-1]); j-- {
			ms[j] = ms[j-1]
		}
		ms[j] = m
		moved = true
	}
	return moved
}

// keyPrefix is the first eight bytes of a key as a number that orders like
// the bytes, so that most comparisons need not look at the key.
func keyPrefix(key []byte) uint64 {
	var k [8]byte
	copy(k[:], key)
	return binary.BigEndian.Uint64(k[:])
}

// emit appends the canonical form once the whole body has been read; when
// no object was out of order, buf already is it.
func (p *parser) emit(dst []byte) []byte {
	if !p.reordered {
		return append(dst, p.buf...)
	}
	return p.segment(dst, 0, int32(len(p.buf)), 0)
}

// segment appends buf[from:to], writing each object that starts in it with
// its members in sorted order. Objects are numbered in the order they
// start, so the first one that can start in the segment is objects[o].
func (p *parser) segment(dst []byte, from, to, o int32) []byte {
	for int(o) < len(p.objects) && p.objects[o].start < to {
		ob := p.objects[o]
		dst = append(dst, p.buf[from:ob.start]...)
		dst = append(dst, tagObject)
		for _, m := range p.members[ob.first : ob.first+ob.n] {
			dst = p.segment(dst, m.start, m.end, m.objects)
		}
		dst = append(dst, tagObjectEnd)
		from = ob.end
		o = ob.next
	}
	return append(dst, p.buf[from:to]...)
}
