package idempotency

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// FuzzUnmarshalCaddyfile feeds arbitrary directive bodies to the parser: it
// must answer with a config or an error, never panic.
func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, s := range []string{
		"idempotency",
		"idempotency {\n required\n ttl 1h\n}",
		"idempotency {\n on_conflict wait 5s\n methods POST PUT\n}",
		"idempotency {\n store memory {\n max_entries 10\n }\n}",
		"idempotency {\n store redis {\n address a:1 b:2\n db 3\n tls\n }\n}",
		"idempotency {\n max_request_body 1MiB\n}",
		"idempotency {\n store\n}",
		"idempotency {\n fingerprint_ignore /a /b/*/c~1d\n fingerprint json\n fingerprint_headers X-A\n}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		tokens, err := caddyfile.Tokenize([]byte(in), "fuzz")
		if err != nil {
			return
		}
		d := caddyfile.NewDispenser(tokens)
		_ = new(Handler).UnmarshalCaddyfile(d)
	})
}
