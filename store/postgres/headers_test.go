package postgres

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"unicode/utf8"
)

var headerCases = []http.Header{
	{},
	{"Content-Type": {"application/json"}},
	{"Content-Type": {"text/html; charset=utf-8"}, "X-Multi": {"a", "b", ""}, "Location": {"/orders/1?a=b&c=<d>"}},
	{"X-Quote": {`say "hi" \ back`}, "X-Ctl": {"tab\there\r\n\x01\x1f\x7f"}, "X-Utf8": {"héllo 世界 \u2028 😀"}},
	{"X-Empty": {}, "X-Null": nil},
}

// appendHeaders must write JSON that decodes, with encoding/json, to the
// header it was given.
func TestAppendHeaders(t *testing.T) {
	for _, h := range headerCases {
		b := appendHeaders(nil, h)
		var got http.Header
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendHeaders(%v) = %s: %v", h, b, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("appendHeaders(%v) = %s, decoding to %v", h, b, got)
		}
	}
	// Bytes that are not UTF-8 are kept as they are, and NUL is escaped,
	// so that parseHeaders gives back exactly what was stored.
	bad := http.Header{"X-Bad\xff": {"a\xffb\xc3", "\x00\xed\xa0\x80"}}
	b := appendHeaders(nil, bad)
	if want := "{\"X-Bad\xff\":[\"a\xffb\xc3\",\"\\u0000\xed\xa0\x80\"]}"; string(b) != want {
		t.Errorf("invalid UTF-8 encoded as %q, want %q", b, want)
	}
	if got, err := parseHeaders(b); err != nil || !reflect.DeepEqual(got, bad) {
		t.Errorf("parseHeaders(%q) = %q, %v; want %q", b, got, err, bad)
	}
}

// parseHeaders reads what encoding/json wrote (rows of earlier versions),
// what appendHeaders wrote, and JSON as PostgreSQL prints a jsonb.
func TestParseHeaders(t *testing.T) {
	for _, h := range headerCases {
		std, _ := json.Marshal(h)
		for _, b := range [][]byte{std, appendHeaders(nil, h)} {
			got, err := parseHeaders(b)
			if err != nil || !reflect.DeepEqual(got, h) {
				t.Errorf("parseHeaders(%s) = %v, %v; want %v", b, got, err, h)
			}
		}
	}
	for in, want := range map[string]http.Header{
		`{"Content-Type": ["application/json"], "X-Multi": ["a", "b"]}`: {"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		" {\n\t\"A\" :\r[ \"x\" , null ] } ":                            {"A": {"x", ""}},
		`{"\u0041\u00e9": ["\ud83d\ude00\n\u0001\/\"", "\ud800"]}`:      {"Aé": {"😀\n\x01/\"", "\ufffd"}},
	} {
		got, err := parseHeaders([]byte(in))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseHeaders(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{``, `null`, `[]`, `{`, `{"A"}`, `{"A":"x"}`, `{"A":[1]}`, `{"A":["x"]`, `{"A":["x"],}`,
		`{"A":["x"]} x`, `{"A":["x]}`, "{\"A\":[\"\x01\"]}", `{"A":[["x"]]}`, `{A:["x"]}`} {
		if h, err := parseHeaders([]byte(bad)); err == nil {
			t.Errorf("parseHeaders(%q) = %v, want an error", bad, h)
		}
	}
}

func FuzzAppendHeaders(f *testing.F) {
	f.Add("Content-Type", "application/json", "x")
	f.Add("X-Bad", "a\xffb\"\\\x00", "\u2028")
	f.Fuzz(func(t *testing.T, name, v1, v2 string) {
		h := http.Header{name: {v1, v2}}
		b := appendHeaders(nil, h)
		want, _ := json.Marshal(h)
		var got, std http.Header
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendHeaders(%q) = %s: %v", h, b, err)
		}
		if err := json.Unmarshal(want, &std); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, std) {
			t.Fatalf("appendHeaders(%q) = %s, decoding to %q; encoding/json's decodes to %q", h, b, got, std)
		}
	})
}

// Whatever encoding/json decodes into a header, parseHeaders decodes alike.
func FuzzParseHeaders(f *testing.F) {
	for _, h := range headerCases {
		b, _ := json.Marshal(h)
		f.Add(b)
	}
	f.Add([]byte(`{"A": ["x", null], "B": null, "\u0041": ["\ud83d\ude00"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseHeaders(b)
		var want http.Header
		if json.Unmarshal(b, &want) != nil || want == nil || !utf8.Valid(b) {
			// encoding/json refuses it, or it is a null or invalid UTF-8,
			// which the server never gives back.
			return
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("parseHeaders(%q) = %q, %v; encoding/json decodes %q", b, got, err, want)
		}
	})
}

var benchHeader = http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}}

// benchHeader as PostgreSQL prints a jsonb.
var benchHeaderJSON = []byte(`{"Location": ["/orders/1"], "Content-Type": ["application/json"]}`)

func BenchmarkAppendHeaders(b *testing.B) {
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		buf = appendHeaders(buf[:0], benchHeader)
	}
}

func BenchmarkParseHeaders(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseHeaders(benchHeaderJSON); err != nil {
			b.Fatal(err)
		}
	}
}

// What the store did before: encoding/json both ways.
func BenchmarkHeadersEncodingJSON(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(benchHeader); err != nil {
			b.Fatal(err)
		}
		var h http.Header
		if err := json.Unmarshal(benchHeaderJSON, &h); err != nil {
			b.Fatal(err)
		}
	}
}
