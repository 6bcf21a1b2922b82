package canonjson

import (
	"bytes"
	"math/big"
	"regexp"
	"strings"
	"testing"
)

// fuzzDocs seeds the corpora: the table's documents and a few bodies shaped
// like API requests.
func fuzzDocs() []string {
	docs := []string{
		`{"order":{"id":"ord_1","items":[{"sku":"tea","qty":2,"price":12.50},{"sku":"mug","qty":1,"price":8}],"sent_at":"2025-01-02T03:04:05Z"},"meta":{"trace_id":"abc"}}`,
		`{"amount":1000,"currency":"EUR","description":"caf\u00e9 \"latte\"","tags":["a","b",null,true,false],"ratio":-1.5e-3}`,
		`[{"b":[{"d":1,"c":{"f":2,"e":3}}],"a":0},{"*":1,"~":2,"/":3,"":4}]`,
		`{"a":{"a":{"a":{"a":[1,[2,[3,{"z":4,"y":5}]]]}}}}`,
	}
	for _, g := range groups {
		docs = append(docs, g...)
	}
	return append(docs, invalid...)
}

func FuzzEquivalent(f *testing.F) {
	for i, doc := range fuzzDocs() {
		f.Add([]byte(doc), uint64(i))
	}
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64) {
		if !checkValid(t, doc) || !referable(doc) {
			return
		}
		tree, err := decodeTree(doc)
		if err != nil {
			t.Fatalf("%q: JSON to this package, not to encoding/json: %v", doc, err)
		}
		again := respell(tree, seed)
		want, got := canonical(t, string(doc), nil), canonical(t, string(again), nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("%q and its respelling %q differ:\n%q\n%q", doc, again, want, got)
		}
		var w bytes.Buffer
		if !Write(&w, again, nil) || !bytes.Equal(w.Bytes(), want) {
			t.Fatalf("%q: Write wrote %q, Append appended %q", again, w.Bytes(), want)
		}
	})
}

func FuzzDistinct(f *testing.F) {
	docs := fuzzDocs()
	for _, g := range groups {
		f.Add([]byte(g[0]), []byte(g[len(g)-1]))
	}
	for i := range docs {
		f.Add([]byte(docs[i]), []byte(docs[(i*7+3)%len(docs)]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		okA, okB := checkValid(t, a), checkValid(t, b)
		if !okA || !okB || !referable(a) || !referable(b) {
			return
		}
		ta, errA := decodeTree(a)
		tb, errB := decodeTree(b)
		if errA != nil || errB != nil {
			t.Fatalf("JSON to this package, not to encoding/json: %v, %v", errA, errB)
		}
		if ta.hasDuplicateKeys() || tb.hasDuplicateKeys() {
			return
		}
		same := refEqual(ta, tb)
		ca, cb := canonical(t, string(a), nil), canonical(t, string(b), nil)
		if same != bytes.Equal(ca, cb) {
			t.Fatalf("%q and %q: the reference says equal=%v, the canonical forms are\n%q\n%q", a, b, same, ca, cb)
		}
	})
}

func FuzzIgnore(f *testing.F) {
	for i, doc := range fuzzDocs() {
		f.Add([]byte(doc), uint64(i), "")
	}
	f.Add([]byte(`{"sent_at":1,"items":[{"ts":2,"v":3}],"a~b":{"c/d":4}}`), uint64(1), "/sent_at\n/items/*/ts\n/a~0b/c~1d")
	f.Add([]byte(`[[1,2],[3,{"0":4}]]`), uint64(2), "/*/1\n/1/1/0")
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64, extra string) {
		if !checkValid(t, doc) || !referable(doc) {
			return
		}
		tree, err := decodeTree(doc)
		if err != nil {
			t.Fatalf("%q: JSON to this package, not to encoding/json: %v", doc, err)
		}
		ptrs := pickPointers(tree, seed)
		for _, p := range strings.Split(extra, "\n") {
			if _, err := Compile([]string{p}); err == nil {
				ptrs = append(ptrs, p)
			}
		}
		ign, err := Compile(ptrs)
		if err != nil {
			if strings.Contains(err.Error(), "overlap too much") {
				return
			}
			t.Fatalf("%q: %v", ptrs, err)
		}
		got, ok := Append(nil, doc, ign)
		if !ok {
			t.Fatalf("%q: not JSON once %q are ignored", doc, ptrs)
		}
		var tokens [][]string
		for _, p := range ptrs {
			tokens = append(tokens, pointerTokens(p))
		}
		rest := respell(tree.without(tokens), seed)
		if want := canonical(t, string(rest), nil); !bytes.Equal(got, want) {
			t.Fatalf("%q without %q: got %q, want that of %q: %q", doc, ptrs, got, rest, want)
		}
	})
}

// smallNumber is a number whose exponent big.Rat can take.
var smallNumber = regexp.MustCompile(`^-?[0-9.]+([eE][+-]?0*[0-9]{1,4})?$`)

// The reference's decimals must agree with big.Rat where big.Rat can go.
func TestReferenceDecimal(t *testing.T) {
	var nums []string
	for _, g := range groups {
		for _, doc := range g {
			if d := strings.TrimSpace(doc); smallNumber.MatchString(d) {
				nums = append(nums, d)
			}
		}
	}
	if len(nums) < 40 {
		t.Fatalf("only %d numbers in the table", len(nums))
	}
	for _, a := range nums {
		for _, b := range nums {
			ra, okA := new(big.Rat).SetString(a)
			rb, okB := new(big.Rat).SetString(b)
			if !okA || !okB {
				t.Fatalf("big.Rat cannot read %s or %s", a, b)
			}
			if got, want := parseDecimal(a).equal(parseDecimal(b)), ra.Cmp(rb) == 0; got != want {
				t.Errorf("%s = %s: reference says %v, big.Rat %v", a, b, got, want)
			}
		}
	}
}

// The respeller must keep the meaning, and the order of duplicate keys,
// and change the spelling.
func TestRespell(t *testing.T) {
	doc := `{"a":[1,-2.5e3,0,"x\"y/é😀",{"b":null,"c":true,"d":false}],"z":1e-7,"a":100,"y":"\u0000"}`
	tree, err := decodeTree([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	spellings := make(map[string]bool)
	for seed := range uint64(20) {
		again := respell(tree, seed)
		spellings[string(again)] = true
		back, err := decodeTree(again)
		if err != nil {
			t.Fatalf("%q: %v", again, err)
		}
		var kinds []byte
		for i, m := range back.members {
			if m.key == "a" {
				kinds = append(kinds, m.val.kind)
				back.members[i].key += string(rune('0' + len(kinds)))
			}
		}
		if string(kinds) != "[d" {
			t.Errorf("%q: duplicate keys out of order", again)
		}
		tree.members[0].key, tree.members[2].key = "a1", "a2"
		if !refEqual(tree, back) {
			t.Errorf("%q means something else than %q", again, doc)
		}
		tree.members[0].key, tree.members[2].key = "a", "a"
	}
	if len(spellings) < 15 {
		t.Errorf("only %d spellings out of 20", len(spellings))
	}
}
