package canonjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// groups lists documents that must have one canonical form within a group,
// and a form of their own across groups: every group's first document is
// compared with every other group's.
var groups = [][]string{
	// Numbers: one value, many spellings; exact, never through float64.
	{`1`, `1.0`, `1.00`, `10e-1`, `0.1e1`, `1E0`, `1e+0`, `1e-0`, `100e-2`, `0.01e2`, ` 1 `, `1e00`},
	{`100`, `1e2`, `1E+2`, `10e1`, `0.1e3`, `1000e-1`, `100.000`, `1e0002`},
	{`-0`, `0`, `0.0`, `0e5`, `-0.0e-7`, `0E0`, `0.000`, `-0e+0`},
	{`-1`, `-1.0`, `-10e-1`, `-0.1E1`},
	{`12345678901234567890`, `1.2345678901234567890e19`, `123456789012345678900e-1`},
	{`12345678901234567891`},
	{`0.1`, `1e-1`, `0.10`, `10e-2`},
	{`0.1000000000000000000001`, `1000000000000000000001e-22`},
	{`0.30000000000000004`},
	{`0.3`},
	{`123e-2`, `1.23`, `0.0123e2`, `12.3E-1`},
	{`1.23e-2`, `0.0123`},
	{`-1.23`},
	{`2e3`, `2e+3`, `2000`, `2.000e3`},
	{`2e-3`, `0.002`},
	{`-2e-3`},
	{`1e1000000000000000000`, `10e999999999999999999`, `0.1e1000000000000000001`, `1e+0001000000000000000000`},
	{`1e-1000000000000000000`, `0.1e-999999999999999999`, `10e-1000000000000000001`},
	{`1e-999999999999999999`},
	{`1e99999999999999999999999999`, `100e99999999999999999999999997`, `0.01e100000000000000000000000001`},
	{`1e-99999999999999999999999999`, `0.01e-99999999999999999999999997`},
	{`1e999999999999999999`, `0.0001e1000000000000000003`},
	{`9999999999999999999999e9999999999999999999999`},
	{`1e9223372036854775807`, `10e9223372036854775806`},
	{`1e9223372036854775808`, `0.1e9223372036854775809`},
	{`1e-9223372036854775808`, `10e-9223372036854775809`},

	// Strings: compared decoded.
	{`"é"`, `"\u00e9"`, `"\u00E9"`},
	{`"e\u0301"`}, // another Unicode normalisation is another string
	{`"/"`, `"\/"`, `"\u002f"`},
	{`"\n"`, `"\u000a"`, `"\u000A"`},
	{`"😀"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`},
	{`"\ud83d"`},
	{`"\ude00"`},
	{`"\ude00\ud83d"`},
	{`"\ud83dx"`},
	{`"\ufffd"`, `"` + "\ufffd" + `"`},
	{`""`},
	{`"\""`, `"\u0022"`},
	{`"\\"`, `"\u005c"`, `"\u005C"`},
	{`"\b\f\r\t"`, `"\u0008\u000c\u000d\u0009"`},
	{`"\u0000"`},
	{`"a\u0000b"`},
	{`"ab"`, `"\u0061b"`},

	// Types never collide.
	{`"1"`}, {`"null"`}, {`null`, ` null `}, {`[]`, `[ ]`, "[\n]"}, {`{}`, `{ }`, "{\t}"},
	{`true`}, {`"true"`}, {`false`}, {`"false"`},
	{`[null]`}, {`[[]]`}, {`[{}]`}, {`{"":null}`}, {`{"":""}`}, {`[""]`},
	{`[0]`}, {`["0"]`}, {`{"0":0}`}, {`["d0"]`}, {`"d0"`},

	// Whitespace.
	{`{"a":[1,2]}`, " {\n\t\"a\" : [ 1 , 2 ] \r\n} ", `{"a":[1,2.0]}`},

	// Objects: member order does not count, duplicate keys keep theirs.
	{`{"a":1,"b":2}`, `{"b":2,"a":1}`, `{"b":2.0,"\u0061":1}`},
	{`{"a":1}`},
	{`{"b":2}`},
	{`{"a":1,"a":2}`, ` {"a" :1,"a": 2}`, `{"\u0061":1,"a":2}`},
	{`{"a":2,"a":1}`},
	{`{"a":1,"b":2,"a":3}`, `{"b":2,"a":1,"a":3}`, `{"a":1,"a":3,"b":2}`},
	{`{"a":3,"b":2,"a":1}`},
	{`{"a":1,"ab":2}`, `{"ab":2,"a":1}`},
	{`{"ab":1,"a":2}`},
	{`{"a":{"b":1}}`},
	{`{"a":{},"b":1}`},
	{`{"a\nb":1,"\u00e9":2}`, `{"\u00E9":2,"a\u000ab":1}`},
	{`{"\u00e9":1,"z":2,"é":3}`, `{"z":2,"é":1,"\u00e9":3}`},

	// Nested.
	{
		`{"x":{"b":[1,{"d":1,"c":2}],"a":null},"w":[]}`,
		`{"w":[],"x":{"a":null,"b":[1,{"c":2,"d":1}]}}`,
		`{"w":[ ],"x":{"b":[1.0,{"c":20e-1,"d":1}],"a":null}}`,
	},
	{`{"x":{"b":[1,{"d":2,"c":1}],"a":null},"w":[]}`},
	{`{"x":{"b":[{"d":1,"c":2},1],"a":null},"w":[]}`},

	// Arrays: order counts, and nesting is not flattened.
	{`[1,2]`}, {`[2,1]`}, {`[12]`}, {`[[1],2]`}, {`[[1,2]]`}, {`[1,[2]]`},
	{`["ab"]`}, {`["a","b"]`}, {`{"a":"b"}`}, {`["a"]`}, {`{"ab":""}`},
	{`{"a":{}}`}, {`{"a":[]}`}, {`[{},{}]`}, {`[{"":{}}]`},
}

func canonical(t testing.TB, doc string, ign *Ignore) []byte {
	t.Helper()
	out, ok := Append(nil, []byte(doc), ign)
	if !ok {
		t.Fatalf("%q: not JSON", doc)
	}
	return out
}

func TestEquivalentSpellings(t *testing.T) {
	for _, g := range groups {
		want := canonical(t, g[0], nil)
		for _, doc := range g[1:] {
			if got := canonical(t, doc, nil); !bytes.Equal(got, want) {
				t.Errorf("%s and %s differ:\n%q\n%q", g[0], doc, want, got)
			}
		}
	}
}

func TestDistinctValues(t *testing.T) {
	seen := make(map[string]string)
	for _, g := range groups {
		out := string(canonical(t, g[0], nil))
		if other, dup := seen[out]; dup {
			t.Errorf("%s and %s are one canonical form %q", other, g[0], out)
		}
		seen[out] = g[0]
	}
}

var invalid = []string{
	``, ` `, "\n\t\r ", `01`, `-01`, `00`, `-`, `--1`, `+1`, `1.`, `.1`, `1.e1`, `1e`, `1e+`, `1E-`,
	`1e1.5`, `0x10`, `NaN`, `Infinity`, `-Infinity`, `1 2`, `{`, `}`, `[`, `]`, `[]]`, `{}}`,
	`[1,]`, `[,1]`, `[1 2]`, `{"a":1,}`, `{,"a":1}`, `{"a"}`, `{"a":}`, `{a:1}`, `{1:1}`,
	`{"a":1 "b":2}`, `{"a" 1}`, `"abc`, `"\x"`, `"\u12"`, `"\u12G4"`, `"\`, "\"a\tb\"",
	"\"a\x00b\"", "\"\x1f\"", `tru`, `nul`, `fals`, `truee`, `True`, `null,`, `'a'`,
	"\ufeff{}", `[1]x`, "{}\x00", `"\ud800\u"`,
}

func TestInvalid(t *testing.T) {
	for _, doc := range invalid {
		if json.Valid([]byte(doc)) {
			t.Fatalf("%q: the table is wrong, encoding/json accepts it", doc)
		}
		dst := []byte("prefix")
		if out, ok := Append(dst, []byte(doc), nil); ok || string(out) != "prefix" {
			t.Errorf("%q: got ok=%v and %q, want not JSON and dst unchanged", doc, ok, out)
		}
	}
}

// Bytes that are not UTF-8 make the body not JSON to this package, though
// encoding/json accepts them: it would decode two such bodies to one
// string of U+FFFD.
func TestInvalidUTF8(t *testing.T) {
	for _, doc := range []string{"\"\xff\"", "\"a\xc3\"", "{\"\xe9\":1}", "[\"\xed\xa0\x80\"]", "\"\xf4\x90\x80\x80\"", "\"\\n\xff\""} {
		if !json.Valid([]byte(doc)) {
			t.Fatalf("%q: the table is wrong, encoding/json refuses it", doc)
		}
		if _, ok := Append(nil, []byte(doc), nil); ok {
			t.Errorf("%q: got JSON, want not JSON", doc)
		}
	}
}

// An escaped lone surrogate is valid JSON and must not pass for U+FFFD,
// which is what encoding/json decodes it to.
func TestLoneSurrogate(t *testing.T) {
	lone := canonical(t, `"\ud800"`, nil)
	if bytes.Equal(lone, canonical(t, `"\ufffd"`, nil)) {
		t.Error(`"\ud800" and "\ufffd" are one canonical form`)
	}
	if !bytes.Equal(canonical(t, `"\ud800x"`, nil), canonical(t, `"\uD800\u0078"`, nil)) {
		t.Error(`a lone surrogate's spelling counts`)
	}
}

func TestDepth(t *testing.T) {
	for _, c := range []struct {
		open, close string
		levels      int // per open
	}{{"[", "]", 1}, {`{"a":`, "}", 1}, {`[{"a":`, "}]", 2}} {
		for _, depth := range []int{MaxDepth, MaxDepth + 2, 100 * MaxDepth} {
			n := depth / c.levels
			doc := strings.Repeat(c.open, n) + "1" + strings.Repeat(c.close, n)
			_, ok := Append(nil, []byte(doc), nil)
			if want := depth <= MaxDepth; ok != want {
				t.Errorf("%s nested %d deep: ok=%v, want %v", c.open, depth, ok, want)
			}
			if ok != (nesting([]byte(doc)) <= MaxDepth) {
				t.Errorf("%s nested %d deep: nesting says %d", c.open, depth, nesting([]byte(doc)))
			}
		}
	}
}

func TestAppendKeepsPrefix(t *testing.T) {
	doc := []byte(`{"b":1,"a":[true,{"d":null,"c":"x"}]}`)
	alone := canonical(t, string(doc), nil)
	out, ok := Append([]byte("prefix"), doc, nil)
	if !ok || string(out) != "prefix"+string(alone) {
		t.Errorf("got %q, want prefix then %q", out, alone)
	}
}

// Write must hash what Append appends, whether or not members were
// reordered.
func TestWriteMatchesAppend(t *testing.T) {
	for _, g := range groups {
		for _, doc := range g {
			var w bytes.Buffer
			if !Write(&w, []byte(doc), nil) {
				t.Fatalf("%q: not JSON", doc)
			}
			if want := canonical(t, doc, nil); !bytes.Equal(w.Bytes(), want) {
				t.Errorf("%q: Write wrote %q, Append appended %q", doc, w.Bytes(), want)
			}
		}
	}
	h := sha256.New()
	if Write(h, []byte(`{"a":`), nil) || h.Size() != sha256.Size {
		t.Fatal("Write of a body that is not JSON reported JSON")
	}
	if got, want := h.Sum(nil), sha256.New().Sum(nil); !bytes.Equal(got, want) {
		t.Error("Write of a body that is not JSON wrote bytes")
	}
}

// The validity rule is encoding/json's, plus valid UTF-8, for bodies within
// the depth bound.
func TestValidLikeEncodingJSON(t *testing.T) {
	for _, g := range groups {
		for _, doc := range g {
			checkValid(t, []byte(doc))
		}
	}
	for _, doc := range invalid {
		checkValid(t, []byte(doc))
	}
}

func checkValid(t testing.TB, doc []byte) (ok bool) {
	t.Helper()
	_, ok = Append(nil, doc, nil)
	want := json.Valid(doc) && utf8.Valid(doc)
	if ok != want && !(want && nesting(doc) > MaxDepth) {
		t.Fatalf("%q: ok=%v, encoding/json and UTF-8 say %v", doc, ok, want)
	}
	return ok
}

// nesting is how deep arrays and objects nest in a valid document.
func nesting(doc []byte) int {
	depth, deepest := 0, 0
	inString := false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}
