package store

import (
	"strings"
	"testing"
)

func TestParseClientKey(t *testing.T) {
	long := strings.Repeat("k", MaxClientKeyLen)
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`abc`, "abc", true},
		{`"abc"`, "abc", true},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"a\"b"`, `a"b`, true},
		{`"a\\b"`, `a\b`, true},
		{`a"b`, `a"b`, true},
		{long, long, true},
		{`"` + long + `"`, long, true},
		{long + "k", "", false},
		{`"` + long + `k"`, "", false},
		{``, "", false},
		{`""`, "", false},
		{`"`, "", false},
		{`"abc`, "", false},
		{`"abc"x`, "", false},
		{`"abc";p=1`, "", false},
		{`"a b"`, "", false},
		{`a b`, "", false},
		{`"a\nb"`, "", false},
		{`"a\x"`, "", false},
		{"caf\xc3\xa9", "", false},
		{"a\tb", "", false},
		{"a\x7fb", "", false},
		// Two joined Idempotency-Key lines are a list, not a key.
		{`a,b`, "", false},
		{`a, b`, "", false},
		{`,`, "", false},
		{`"a,b"`, "a,b", true},
	} {
		got, ok := ParseClientKey(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseClientKey(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseClientKey(f *testing.F) {
	for _, s := range []string{`abc`, `"abc"`, `"a\"b"`, `""`, `"`, "a b", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, ok := ParseClientKey(in)
		if !ok {
			if key != "" {
				t.Fatalf("refused %q but returned %q", in, key)
			}
			return
		}
		if len(key) == 0 || len(key) > MaxClientKeyLen {
			t.Fatalf("accepted %q as a key of length %d", in, len(key))
		}
		for i := 0; i < len(key); i++ {
			if !visible(key[i]) {
				t.Fatalf("accepted %q with invisible byte %#x", in, key[i])
			}
		}
		// The bare spelling of an accepted key means the same key, and so
		// does its sf-string spelling.
		if key[0] != '"' {
			if again, ok := ParseClientKey(key); !ok || again != key {
				t.Fatalf("bare spelling of %q parsed as %q, %v", key, again, ok)
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if len(quoted) <= 2*MaxClientKeyLen+2 {
			if again, ok := ParseClientKey(quoted); !ok || again != key {
				t.Fatalf("sf-string spelling %s parsed as %q, %v; want %q", quoted, again, ok, key)
			}
		}
	})
}
