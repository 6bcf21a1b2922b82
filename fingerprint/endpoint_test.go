package fingerprint

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{
		"api.example.com":     "api.example.com",
		"api.example.com:443": "api.example.com",
		"127.0.0.1:8081":      "127.0.0.1",
		"[::1]:8080":          "::1",
		"[::1]":               "[::1]",
		"::1":                 "::1", // not a host:port: kept, as Caddy does
		"":                    "",
	} {
		if got := hostOnly(in); got != want {
			t.Errorf("hostOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

// An endpoint is kept as it is up to maxEndpoint bytes; a longer one as a
// readable prefix, cut between characters, and its hash, longer than any
// endpoint kept as it is.
func TestKeptEndpoint(t *testing.T) {
	exact := strings.Repeat("a", maxEndpoint)
	if got := keptEndpoint(exact); got != exact {
		t.Fatalf("an endpoint of maxEndpoint bytes kept as %q", got)
	}
	for _, e := range []string{
		exact + "b",
		strings.Repeat("a", maxEndpoint-1) + "é" + strings.Repeat("b", 10),
		strings.Repeat("\x80", 2*maxEndpoint), // not UTF-8
	} {
		got := keptEndpoint(e)
		if len(got) <= maxEndpoint || len(got) > maxEndpoint+100 || keptEndpoint(e) != got || keptEndpoint(e+"x") == got {
			t.Errorf("%.20q… (%d bytes) kept as %d bytes %q", e, len(e), len(got), got)
		}
		if utf8.ValidString(e) && !utf8.ValidString(got) {
			t.Errorf("%.20q… kept as %q, cut within a character", e, got)
		}
	}
}

// The names are canonical, sorted and listed once, so their order and
// case in the config do not change fingerprints.
func TestFingerprintHeaderNamesCanonical(t *testing.T) {
	a, _ := NewPayload("body", nil, nil, []string{"x-account-id", "Content-Type", "X-ACCOUNT-ID"})
	b, _ := NewPayload("body", nil, nil, []string{"content-type", "X-Account-Id"})
	if strings.Join(a.headers, ",") != "Content-Type,X-Account-Id" || strings.Join(b.headers, ",") != strings.Join(a.headers, ",") {
		t.Fatalf("headers %q and %q", a.headers, b.headers)
	}
}
