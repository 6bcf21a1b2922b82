package canonjson

import (
	"bytes"
	"sync"
	"testing"
)

func TestCompileErrors(t *testing.T) {
	for _, c := range []struct{ ptr, want string }{
		{"sent_at", "fingerprint_ignore: 'sent_at' is not a JSON pointer (RFC 6901): must start with /"},
		{"", "fingerprint_ignore: '' is not a JSON pointer (RFC 6901): must start with /"},
		{"#/a", "fingerprint_ignore: '#/a' is not a JSON pointer (RFC 6901): must start with /"},
		{"/a~2", "fingerprint_ignore: '/a~2' is not a JSON pointer (RFC 6901): ~ must be followed by 0 or 1"},
		{"/a~", "fingerprint_ignore: '/a~' is not a JSON pointer (RFC 6901): ~ must be followed by 0 or 1"},
		{"/a/~~0", "fingerprint_ignore: '/a/~~0' is not a JSON pointer (RFC 6901): ~ must be followed by 0 or 1"},
		{"/\xff", "fingerprint_ignore: '/\xff' is not a JSON pointer (RFC 6901): not valid UTF-8"},
	} {
		_, err := Compile([]string{"/ok", c.ptr})
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: got error %v, want %q", c.ptr, err, c.want)
		}
	}
	for _, ptr := range []string{"/", "/a~1b", "/m~0n", "/~01", "/*", "/a//b", "/é"} {
		if _, err := Compile([]string{ptr}); err != nil {
			t.Errorf("%q: %v", ptr, err)
		}
	}
}

func TestIgnore(t *testing.T) {
	for _, c := range []struct {
		ptrs      []string
		doc, want string // want is read with nothing ignored
	}{
		{[]string{"/sent_at"}, `{"a":1,"sent_at":"x"}`, `{"a":1}`},
		{[]string{"/sent_at"}, `{"sent_at":"x"}`, `{}`},
		{[]string{"/sent_at"}, `{"a":1}`, `{"a":1}`},
		{[]string{"/sent_at"}, `{"sent\u005fat":1,"b":[]}`, `{"b":[]}`},
		{[]string{"/sent_at"}, `{"a":{"sent_at":1}}`, `{"a":{"sent_at":1}}`},
		{[]string{"/sent_at"}, `[{"sent_at":1}]`, `[{"sent_at":1}]`},
		{[]string{"/sent_at"}, `1`, `1`},
		{[]string{"/meta/trace_id"}, `{"meta":{"trace_id":"t","v":1},"a":2}`, `{"a":2,"meta":{"v":1}}`},
		{[]string{"/meta/trace_id"}, `{"trace_id":1,"meta":"x"}`, `{"trace_id":1,"meta":"x"}`},
		{[]string{"/items/*/client_ts"}, `{"items":[{"client_ts":1,"x":1},{"x":2,"client_ts":3},{"x":3}]}`, `{"items":[{"x":1},{"x":2},{"x":3}]}`},
		{[]string{"/items/*/client_ts"}, `{"items":{"a":{"client_ts":1,"x":1}}}`, `{"items":{"a":{"x":1}}}`},
		{[]string{"/items/1"}, `{"items":[10,20,30]}`, `{"items":[10,30]}`},
		{[]string{"/items/1", "/items/2"}, `{"items":[10,20,30]}`, `{"items":[10]}`},
		{[]string{"/items/01"}, `{"items":[10,20]}`, `{"items":[10,20]}`},
		{[]string{"/items/01"}, `{"items":{"01":1,"1":2}}`, `{"items":{"1":2}}`},
		{[]string{"/items/1"}, `{"items":{"1":5,"2":6}}`, `{"items":{"2":6}}`},
		{[]string{"/items/-"}, `{"items":[1,2]}`, `{"items":[1,2]}`},
		{[]string{"/*"}, `{"a":1,"b":2}`, `{}`},
		{[]string{"/*"}, `[1,[2],{"c":3}]`, `[]`},
		{[]string{"/a~1b"}, `{"a/b":1,"a":{"b":2}}`, `{"a":{"b":2}}`},
		{[]string{"/m~0n"}, `{"m~n":1,"c":2}`, `{"c":2}`},
		{[]string{"/~01"}, `{"~1":1,"/":2}`, `{"/":2}`},
		{[]string{"/"}, `{"":1,"a":2}`, `{"a":2}`},
		{[]string{"/a//b"}, `{"a":{"":{"b":1,"c":2}}}`, `{"a":{"":{"c":2}}}`},
		{[]string{"/a"}, `{"a":1,"b":2,"a":3}`, `{"b":2}`},
		{[]string{"/a/x", "/*/y"}, `{"a":{"x":1,"y":2,"z":3},"b":{"x":1,"y":2}}`, `{"a":{"z":3},"b":{"x":1}}`},
		{[]string{"/a/b", "/a"}, `{"a":{"b":1},"c":1}`, `{"c":1}`},
		{[]string{"/*/*/t"}, `{"x":{"y":{"t":1,"u":2}},"t":5,"z":{"t":6}}`, `{"x":{"y":{"u":2}},"t":5,"z":{"t":6}}`},
		{[]string{"/*/*/t"}, `[[{"t":1}],[{"t":2,"s":3}]]`, `[[{}],[{"s":3}]]`},
		{[]string{"/*/*"}, `[[1,2],{"a":1},3]`, `[[],{},3]`},
		// An ignored value that needed reordering must leave nothing behind.
		{[]string{"/a"}, `{"b":{"d":1,"c":2},"a":{"z":1,"y":[{"q":1,"p":2}]},"e":{"g":1,"f":2}}`, `{"b":{"c":2,"d":1},"e":{"f":2,"g":1}}`},
		{[]string{"/0"}, `[{"b":1,"a":2},{"d":1,"c":2}]`, `[{"c":2,"d":1}]`},
		{[]string{"/1"}, `[{"b":1,"a":2},{"d":1,"c":2},{"f":1,"e":2}]`, `[{"a":2,"b":1},{"e":2,"f":1}]`},
	} {
		ign, err := Compile(c.ptrs)
		if err != nil {
			t.Fatal(err)
		}
		got, want := canonical(t, c.doc, ign), canonical(t, c.want, nil)
		if !bytes.Equal(got, want) {
			t.Errorf("%s without %q: got %q, want %q (%s)", c.doc, c.ptrs, got, want, c.want)
		}
		var w bytes.Buffer
		if !Write(&w, []byte(c.doc), ign) || !bytes.Equal(w.Bytes(), want) {
			t.Errorf("%s without %q: Write wrote %q, want %q", c.doc, c.ptrs, w.Bytes(), want)
		}
	}
}

// An ignored value is left out, but the body must still be JSON.
func TestIgnoredValueIsValidated(t *testing.T) {
	ign, err := Compile([]string{"/a", "/*/0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{`{"a":[1,}`, `{"a":01}`, "{\"a\":\"\xff\"}", `{"b":[{"x":tru}]}`, `{"a":"\q"}`} {
		if _, ok := Append(nil, []byte(doc), ign); ok {
			t.Errorf("%q: got JSON", doc)
		}
	}
}

func TestNoPointers(t *testing.T) {
	for _, ign := range []*Ignore{nil, mustCompile(t)} {
		doc := `{"b":1,"a":2}`
		if got, want := canonical(t, doc, ign), canonical(t, `{"a":2,"b":1}`, nil); !bytes.Equal(got, want) {
			t.Errorf("%v: got %q, want %q", ign, got, want)
		}
	}
}

// One Ignore serves every request at once.
func TestIgnoreConcurrent(t *testing.T) {
	ign := mustCompile(t, "/sent_at", "/items/*/ts")
	doc := []byte(`{"sent_at":1,"z":{"b":1,"a":2},"items":[{"ts":1,"v":2},{"v":3,"ts":4}]}`)
	want := canonical(t, `{"items":[{"v":2},{"v":3}],"z":{"a":2,"b":1}}`, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if got, ok := Append(nil, doc, ign); !ok || !bytes.Equal(got, want) {
					t.Errorf("got %q, want %q", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func mustCompile(t testing.TB, ptrs ...string) *Ignore {
	t.Helper()
	ign, err := Compile(ptrs)
	if err != nil {
		t.Fatal(err)
	}
	return ign
}
