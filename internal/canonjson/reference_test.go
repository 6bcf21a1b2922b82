package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
)

// The fuzz targets check the package against a reference built another
// way: encoding/json decodes the document into a tree, numbers stay text
// (UseNumber) and are compared as exact decimals with big.Int exponents.

// node is a decoded JSON value. Unlike a map, it keeps member order and
// duplicate keys, so that a document can be spelled again member by member.
type node struct {
	kind    byte   // one of "{[sdtfn": object, array, string, number, true, false, null
	text    string // a string's value, a number's spelling
	members []field
	elems   []*node
}

type field struct {
	key string
	val *node
}

func decodeTree(doc []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	n, err := decodeNode(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("more than one value")
	}
	return n, nil
}

func decodeNode(d *json.Decoder) (*node, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &node{kind: byte(v)}
		for d.More() {
			if v == '{' {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				val, err := decodeNode(d)
				if err != nil {
					return nil, err
				}
				n.members = append(n.members, field{k.(string), val})
			} else {
				val, err := decodeNode(d)
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, val)
			}
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return n, nil
	case string:
		return &node{kind: 's', text: v}, nil
	case json.Number:
		return &node{kind: 'd', text: string(v)}, nil
	case bool:
		if v {
			return &node{kind: 't'}, nil
		}
		return &node{kind: 'f'}, nil
	case nil:
		return &node{kind: 'n'}, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// surrogateEscape finds escaped surrogates, which encoding/json decodes to
// U+FFFD when they are lone: a tree cannot hold them, so documents that
// have them are left to the table tests.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// referable reports whether the reference can decode doc faithfully.
func referable(doc []byte) bool {
	return !surrogateEscape.Match(doc)
}

func (n *node) hasDuplicateKeys() bool {
	seen := make(map[string]bool)
	for _, m := range n.members {
		if seen[m.key] || m.val.hasDuplicateKeys() {
			return true
		}
		seen[m.key] = true
	}
	for _, e := range n.elems {
		if e.hasDuplicateKeys() {
			return true
		}
	}
	return false
}

// decimal is a number as digits × 10^exp, digits without leading or
// trailing zeros; zero has no digits.
type decimal struct {
	neg    bool
	digits string
	exp    *big.Int
}

func parseDecimal(s string) decimal {
	d := decimal{exp: new(big.Int)}
	if strings.HasPrefix(s, "-") {
		d.neg = true
		s = s[1:]
	}
	mant := s
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		if _, ok := d.exp.SetString(strings.TrimPrefix(s[i+1:], "+"), 10); !ok {
			panic("bad exponent in " + s)
		}
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	d.exp.Sub(d.exp, big.NewInt(int64(len(frac))))
	trimmed := strings.TrimRight(digits, "0")
	d.exp.Add(d.exp, big.NewInt(int64(len(digits)-len(trimmed))))
	d.digits = trimmed
	if d.digits == "" {
		d.neg = false
		d.exp.SetInt64(0)
	}
	return d
}

func (d decimal) equal(e decimal) bool {
	return d.neg == e.neg && d.digits == e.digits && d.exp.Cmp(e.exp) == 0
}

// refEqual compares two trees without duplicate keys by meaning.
func refEqual(a, b *node) bool {
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case 's':
		return a.text == b.text
	case 'd':
		return parseDecimal(a.text).equal(parseDecimal(b.text))
	case '[':
		if len(a.elems) != len(b.elems) {
			return false
		}
		for i := range a.elems {
			if !refEqual(a.elems[i], b.elems[i]) {
				return false
			}
		}
		return true
	case '{':
		if len(a.members) != len(b.members) {
			return false
		}
		bm := make(map[string]*node, len(b.members))
		for _, m := range b.members {
			bm[m.key] = m.val
		}
		for _, m := range a.members {
			v, ok := bm[m.key]
			if !ok || !refEqual(m.val, v) {
				return false
			}
		}
		return true
	}
	return true
}

// without returns the tree less what the pointers (as token lists,
// unescaped) match, matching each array element by its index in n.
func (n *node) without(ptrs [][]string) *node {
	if len(ptrs) == 0 || (n.kind != '{' && n.kind != '[') {
		return n
	}
	out := &node{kind: n.kind}
	under := func(token string) (rest [][]string, drop bool) {
		for _, p := range ptrs {
			if p[0] == token || p[0] == "*" {
				if len(p) == 1 {
					return nil, true
				}
				rest = append(rest, p[1:])
			}
		}
		return rest, false
	}
	for _, m := range n.members {
		if rest, drop := under(m.key); !drop {
			out.members = append(out.members, field{m.key, m.val.without(rest)})
		}
	}
	for i, e := range n.elems {
		if rest, drop := under(strconv.Itoa(i)); !drop {
			out.elems = append(out.elems, e.without(rest))
		}
	}
	return out
}

// respeller writes a tree as another document with the same meaning:
// members shuffled (duplicate keys keeping their order), random
// whitespace, strings escaped at random, numbers spelled another way.
type respeller struct {
	r   *rand.Rand
	buf bytes.Buffer
}

func respell(n *node, seed uint64) []byte {
	rs := &respeller{r: rand.New(rand.NewPCG(seed, seed>>7|1))}
	rs.space()
	rs.value(n)
	rs.space()
	return rs.buf.Bytes()
}

func (rs *respeller) space() {
	for range rs.r.IntN(3) {
		rs.buf.WriteByte(" \t\n\r"[rs.r.IntN(4)])
	}
}

func (rs *respeller) value(n *node) {
	switch n.kind {
	case '{':
		rs.buf.WriteByte('{')
		for i, m := range rs.shuffle(n.members) {
			if i > 0 {
				rs.buf.WriteByte(',')
			}
			rs.space()
			rs.string(m.key)
			rs.space()
			rs.buf.WriteByte(':')
			rs.space()
			rs.value(m.val)
			rs.space()
		}
		if len(n.members) == 0 {
			rs.space()
		}
		rs.buf.WriteByte('}')
	case '[':
		rs.buf.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				rs.buf.WriteByte(',')
			}
			rs.space()
			rs.value(e)
			rs.space()
		}
		if len(n.elems) == 0 {
			rs.space()
		}
		rs.buf.WriteByte(']')
	case 's':
		rs.string(n.text)
	case 'd':
		rs.number(parseDecimal(n.text))
	case 't':
		rs.buf.WriteString("true")
	case 'f':
		rs.buf.WriteString("false")
	case 'n':
		rs.buf.WriteString("null")
	}
}

// shuffle permutes members, then hands the slots each key landed on back
// to that key's members in their first order.
func (rs *respeller) shuffle(ms []field) []field {
	out := make([]field, len(ms))
	for i, j := range rs.r.Perm(len(ms)) {
		out[i] = ms[j]
	}
	next := make(map[string]int)
	for i := range out {
		k := out[i].key
		for j := next[k]; j < len(ms); j++ {
			if ms[j].key == k {
				out[i] = ms[j]
				next[k] = j + 1
				break
			}
		}
	}
	return out
}

var shortEscapes = map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}

func (rs *respeller) string(s string) {
	rs.buf.WriteByte('"')
	for _, r := range s {
		short, hasShort := shortEscapes[r]
		mustEscape := r == '"' || r == '\\' || r < 0x20
		switch c := rs.r.IntN(3); {
		case c == 0 && !mustEscape:
			rs.buf.WriteRune(r)
		case c == 1 && hasShort:
			rs.buf.WriteString(short)
		default:
			rs.uescape(r)
		}
	}
	rs.buf.WriteByte('"')
}

func (rs *respeller) uescape(r rune) {
	digits := "0123456789abcdef"
	if rs.r.IntN(2) == 0 {
		digits = "0123456789ABCDEF"
	}
	write := func(u rune) {
		rs.buf.WriteString(`\u`)
		for shift := 12; shift >= 0; shift -= 4 {
			rs.buf.WriteByte(digits[u>>shift&0xf])
		}
	}
	if r > 0xffff {
		hi, lo := utf16.EncodeRune(r)
		write(hi)
		write(lo)
		return
	}
	write(r)
}

// number spells digits × 10^exp another way: trailing zeros added to the
// digits, the point moved, zeros after "0.", the exponent written with a
// sign or leading zeros, or left out when it is zero.
func (rs *respeller) number(d decimal) {
	if d.neg || (d.digits == "" && rs.r.IntN(2) == 0) {
		rs.buf.WriteByte('-')
	}
	if d.digits == "" {
		rs.buf.WriteByte('0')
		if z := rs.r.IntN(3); z > 0 {
			rs.buf.WriteString("." + strings.Repeat("0", z))
		}
		if rs.r.IntN(2) == 0 {
			rs.exponent(big.NewInt(rs.r.Int64N(20) - 10))
		}
		return
	}
	t := rs.r.IntN(3)
	digits := d.digits + strings.Repeat("0", t)
	q := rs.r.IntN(len(digits) + 1)
	intPart, frac := digits[:q], digits[q:]
	if intPart == "" {
		intPart = "0"
		frac = strings.Repeat("0", rs.r.IntN(3)) + frac
	}
	rs.buf.WriteString(intPart)
	if frac != "" {
		rs.buf.WriteString("." + frac)
	}
	exp := new(big.Int).Add(d.exp, big.NewInt(int64(len(frac)-t)))
	if exp.Sign() != 0 || rs.r.IntN(2) == 0 {
		rs.exponent(exp)
	}
}

func (rs *respeller) exponent(exp *big.Int) {
	rs.buf.WriteByte("eE"[rs.r.IntN(2)])
	switch {
	case exp.Sign() < 0:
		rs.buf.WriteByte('-')
	case rs.r.IntN(2) == 0:
		rs.buf.WriteByte('+')
	}
	rs.buf.WriteString(strings.Repeat("0", rs.r.IntN(3)))
	rs.buf.WriteString(new(big.Int).Abs(exp).String())
}

// pickPointers picks up to three paths that exist in the tree, some tokens
// turned into *, and writes them as escaped JSON pointers.
func pickPointers(n *node, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 1))
	var ptrs []string
	for range r.IntN(4) {
		var tokens []string
		for cur := n; ; {
			var token string
			var next *node
			switch {
			case cur.kind == '{' && len(cur.members) > 0:
				m := cur.members[r.IntN(len(cur.members))]
				token, next = m.key, m.val
			case cur.kind == '[' && len(cur.elems) > 0:
				i := r.IntN(len(cur.elems))
				token, next = strconv.Itoa(i), cur.elems[i]
			}
			if next == nil {
				break
			}
			if r.IntN(4) == 0 {
				token = "*"
			}
			tokens = append(tokens, token)
			cur = next
			if r.IntN(3) == 0 {
				break
			}
		}
		if len(tokens) == 0 {
			continue
		}
		var b strings.Builder
		for _, t := range tokens {
			b.WriteByte('/')
			b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
		}
		ptrs = append(ptrs, b.String())
	}
	return ptrs
}

// pointerTokens unescapes a pointer as RFC 6901 section 4 says: ~1 first,
// then ~0.
func pointerTokens(ptr string) []string {
	tokens := strings.Split(ptr[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens
}
