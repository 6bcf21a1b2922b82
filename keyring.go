package idempotency

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// keyLen is the size of an encryption key: AES-256.
const keyLen = 32

// sealKey is one key of encryption_keys, ready to seal and open records.
type sealKey struct {
	// id names the key in stored records and logs: the first 4 bytes of
	// the SHA-256 of the key, in hex. It tells keys apart without telling
	// anything of them.
	id   string
	aead cipher.AEAD
}

// keyring holds the configured keys: the first seals, every one opens.
type keyring struct {
	keys []sealKey
}

// newKeyring resolves and decodes the keys of encryption_keys, or returns
// nil if there are none. Errors name a key by its position, never by its
// value, which may be the key itself.
func newKeyring(raw []string) (*keyring, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	repl := caddy.NewReplacer() // {env.*} and {file.*}
	ring := &keyring{}
	for i, r := range raw {
		n := i + 1
		s := strings.TrimSpace(repl.ReplaceKnown(r, ""))
		if s == "" {
			return nil, fmt.Errorf("encryption_keys: key %d is empty (an unset environment variable or an unreadable file?)", n)
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			if b, err = base64.RawStdEncoding.DecodeString(s); err != nil {
				return nil, fmt.Errorf("encryption_keys: key %d is not base64 (generate one with: openssl rand -base64 32)", n)
			}
		}
		if len(b) != keyLen {
			return nil, fmt.Errorf("encryption_keys: key %d decodes to %d bytes, want %d (generate one with: openssl rand -base64 32)", n, len(b), keyLen)
		}
		sum := sha256.Sum256(b)
		id := hex.EncodeToString(sum[:4])
		for j, k := range ring.keys {
			if k.id == id {
				return nil, fmt.Errorf("encryption_keys: key %d repeats key %d", n, j+1)
			}
		}
		block, err := aes.NewCipher(b)
		if err != nil {
			return nil, fmt.Errorf("encryption_keys: making the cipher of key %d: %w", n, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("encryption_keys: making the cipher of key %d: %w", n, err)
		}
		ring.keys = append(ring.keys, sealKey{id: id, aead: aead})
	}
	return ring, nil
}

// ids lists the keys' ids, the sealing key first.
func (r *keyring) ids() []string {
	if r == nil {
		return nil
	}
	ids := make([]string, len(r.keys))
	for i, k := range r.keys {
		ids[i] = k.id
	}
	return ids
}

// byID returns the key whose id is id, if it is configured.
func (r *keyring) byID(id string) (sealKey, bool) {
	if r != nil {
		for _, k := range r.keys {
			if k.id == id {
				return k, true
			}
		}
	}
	return sealKey{}, false
}
