package canonjson

import (
	"bytes"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestMember(t *testing.T) {
	for _, tc := range []struct {
		doc, ptr, want string
		ok             bool
	}{
		{`{"id":"k1","n":1}`, "/id", "k1", true},
		{`{"id":"k1","id":"k2"}`, "/id", "k2", true}, // the last counts
		{`{"a":{"b~/c":"\u0041\n"}}`, "/a/b~0~1c", "A\n", true},
		{`{"ev":[{"id":"x"},{"id":"y"}]}`, "/ev/1/id", "y", true},
		{`{"ev":[{"id":"x"},{"id":"y"}]}`, "/ev/01/id", "", false},
		{`{"id":7}`, "/id", "", false}, // not a string
		{`{"id":null}`, "/id", "", false},
		{`{"other":"x"}`, "/id", "", false},
		{`["x"]`, "/id", "", false},
		{`{"id":"x"`, "/id", "", false}, // not JSON
		{`{"0":"named"}`, "/0", "named", true},
	} {
		only, err := CompileOnly([]string{tc.ptr})
		if err != nil {
			t.Fatal(err)
		}
		for _, filter := range []*Ignore{only, nil} {
			got, ok := "", false
			if d, parsed := Parse([]byte(tc.doc), filter); parsed {
				got, ok = d.Member(pointerTokens(tc.ptr))
				d.Close()
			}
			if got != tc.want || ok != tc.ok {
				t.Errorf("%s at %s (filtered %v) = %q, %v; want %q, %v", tc.doc, tc.ptr, filter != nil, got, ok, tc.want, tc.ok)
			}
		}
	}
}

// A large value off the pointers' paths is read, not kept: the scratch
// space stays small.
func TestOnlyKeepsLittle(t *testing.T) {
	doc := []byte(`{"id":"k","items":[` + strings.TrimSuffix(strings.Repeat(`{"n":12345.6},`, 50_000), ",") + `]}`)
	only, err := CompileOnly([]string{"/id"})
	if err != nil {
		t.Fatal(err)
	}
	// Empty the pool (two cycles: one moves it to the victim cache), lest
	// a parser that an earlier test grew be handed out.
	runtime.GC()
	runtime.GC()
	d, ok := Parse(doc, only)
	if !ok {
		t.Fatal("not JSON")
	}
	defer d.Close()
	if n := cap(d.p.buf); n > 4096 {
		t.Errorf("the scratch space grew to %d bytes for a %d-byte body of which one member is kept", n, len(doc))
	}
}

func FuzzSelect(f *testing.F) {
	for i, doc := range fuzzDocs() {
		f.Add([]byte(doc), uint64(i))
	}
	f.Add([]byte(`{"b":[1,{"x":2,"x":3}],"a":{"*":4},"c":[[5],[6,7]]}`), uint64(3))
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64) {
		if !checkValid(t, doc) || !referable(doc) {
			return
		}
		tree, err := decodeTree(doc)
		if err != nil {
			t.Fatalf("%q: JSON to this package, not to encoding/json: %v", doc, err)
		}
		ptrs := pickPointers(tree, seed)
		only, err := CompileOnly(ptrs)
		if err != nil {
			if strings.Contains(err.Error(), "overlap too much") {
				return
			}
			t.Fatalf("%q: %v", ptrs, err)
		}
		for _, filter := range []*Ignore{only, nil} {
			d, ok := Parse(doc, filter)
			if !ok {
				t.Fatalf("%q: not JSON with the filter of %q", doc, ptrs)
			}
			for _, p := range ptrs {
				var got [][]byte
				d.Values(pointerTokens(p), func(v []byte) { got = append(got, bytes.Clone(v)) })
				var want [][]byte
				for _, m := range tree.at(pointerTokens(p)) {
					want = append(want, canonical(t, string(respell(m, seed)), nil))
				}
				if !slices.EqualFunc(got, want, bytes.Equal) {
					t.Fatalf("%q at %s (filtered %v): got %q, want %q", doc, p, filter != nil, got, want)
				}
			}
			d.Close()
		}
	})
}

// at returns what the pointer's tokens match in n, as Doc.Values finds it:
// members in key order, of duplicate keys the last, elements in order.
func (n *node) at(tokens []string) []*node {
	if len(tokens) == 0 {
		return []*node{n}
	}
	tok, rest := tokens[0], tokens[1:]
	var out []*node
	switch n.kind {
	case '{':
		last := make(map[string]*node)
		for _, m := range n.members {
			last[m.key] = m.val
		}
		keys := make([]string, 0, len(last))
		for k := range last {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if tok == "*" || tok == k {
				out = append(out, last[k].at(rest)...)
			}
		}
	case '[':
		for i, e := range n.elems {
			if tok == "*" || tok == strconv.Itoa(i) {
				out = append(out, e.at(rest)...)
			}
		}
	}
	return out
}
