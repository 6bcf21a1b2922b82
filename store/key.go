package store

import (
	"crypto/rand"
	"sync/atomic"
)

// MaxClientKeyLen follows Stripe: long enough for any UUID or ULID scheme,
// short enough that a key can never be used to stuff data into the store.
const MaxClientKeyLen = 255

// ParseClientKey returns the key of an Idempotency-Key value: an RFC 8941
// sf-string ("abc") as the IETF draft says, or bare (abc) as most clients
// send it, of 1 to 255 visible ASCII characters. A bare key may not hold a
// comma: an intermediary that joins two header lines sends "a, b".
func ParseClientKey(v string) (string, bool) {
	if len(v) > 0 && v[0] == '"' {
		return parseSFString(v)
	}
	if len(v) == 0 || len(v) > MaxClientKeyLen {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		if !visible(v[i]) || v[i] == ',' {
			return "", false
		}
	}
	return v, true
}

// parseSFString decodes an sf-string that makes up the whole value (the
// draft gives the field no parameters), allocating only for escapes.
func parseSFString(v string) (string, bool) {
	var out []byte
	start := 1
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", false
			}
			out = append(out, v[start:i]...)
			i++
			start = i
		case c == '"':
			if i != len(v)-1 {
				return "", false
			}
			var key string
			if out == nil {
				key = v[start:i]
			} else {
				key = string(append(out, v[start:i]...))
			}
			if len(key) == 0 || len(key) > MaxClientKeyLen {
				return "", false
			}
			return key, true
		case !visible(c):
			// sf-strings allow spaces, but a key is visible characters only
			return "", false
		}
	}
	return "", false // unterminated
}

func visible(c byte) bool { return c > ' ' && c < 0x7f }

// Owner tokens are a random per-process prefix and a counter: unique across
// instances without a random read per request.
var (
	tokenPrefix  [8]byte
	tokenCounter atomic.Uint64
)

func init() {
	rand.Read(tokenPrefix[:])
}

// NewToken returns a claim's owner token.
func NewToken() Token {
	var t Token
	copy(t[:8], tokenPrefix[:])
	n := tokenCounter.Add(1)
	for i := range 8 {
		t[8+i] = byte(n >> (8 * i))
	}
	return t
}
