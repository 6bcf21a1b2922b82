package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const keyLen = 32 // AES-256

// sealKey is one key of encryption_keys, ready to seal and open records.
type sealKey struct {
	// id names the key in records and logs: the first 4 bytes of its
	// SHA-256, in hex, which tell keys apart and nothing of them.
	id   string
	raw  [keyIDLen]byte // id, as the sealed records hold it
	aead cipher.AEAD
}

// Keyring holds the configured keys: the first seals, every one opens.
type Keyring struct {
	keys []sealKey
}

// NewKeyring decodes encryption_keys, or returns nil if none. Errors name a
// key by position, never by value, which may be the key itself.
func NewKeyring(raw []string) (*Keyring, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	repl := caddy.NewReplacer() // {env.*} and {file.*}
	ring := &Keyring{}
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
		id := hex.EncodeToString(sum[:keyIDLen])
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
		ring.keys = append(ring.keys, sealKey{id: id, raw: [keyIDLen]byte(sum[:keyIDLen]), aead: aead})
	}
	return ring, nil
}

// IDs lists the keys' ids, the sealing key first.
func (r *Keyring) IDs() []string {
	if r == nil {
		return nil
	}
	ids := make([]string, len(r.keys))
	for i, k := range r.keys {
		ids[i] = k.id
	}
	return ids
}

func (r *Keyring) byID(id [keyIDLen]byte) (sealKey, bool) {
	if r != nil {
		for _, k := range r.keys {
			if k.raw == id {
				return k, true
			}
		}
	}
	return sealKey{}, false
}

// A sealed response's body is its envelope:
//
//	0      sealFormat: AES-256-GCM, a random 12-byte nonce
//	1:5    the id of the key that sealed it
//	5      the response body's size, a uvarint (inspect shows it)
//	then   the nonce, and the ciphertext of header and body (record codec)
//
// The associated data (sealAAD) binds the ciphertext to the key hash and to
// the record's clear fields: a record copied to another key, or changed in
// any of them, fails.
const (
	sealFormat = 1
	keyIDLen   = 4
)

// seal returns resp with its headers and body sealed with the first key,
// bound to k and to c's endpoint and fingerprint, which the store keeps
// beside it.
func (r *Keyring) seal(k store.Key, c *store.Claim, resp *store.Response) (*store.Response, error) {
	key := r.keys[0]
	head := append([]byte{sealFormat}, key.raw[:]...)
	head = binary.AppendUvarint(head, uint64(len(resp.Body)))
	nonceLen := key.aead.NonceSize()
	buf := make([]byte, len(head)+nonceLen, len(head)+nonceLen+len(resp.Body)+256+key.aead.Overhead())
	copy(buf, head)
	nonce := buf[len(head):]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("sealing the response: %w", err)
	}
	plain := store.AppendRecord(nil, &store.Record{State: store.Completed, Response: store.Response{Header: resp.Header, Body: resp.Body}})
	out := &store.Response{Status: resp.Status, Sealed: true}
	// the record as the store keeps it, and open sees it
	stored := store.Record{State: store.Completed, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint, Response: *out}
	out.Body = key.aead.Seal(buf, nonce, plain, sealAAD(k, &stored, head))
	return out, nil
}

// open returns rec with the headers and body sealed in its body.
func (r *Keyring) open(k store.Key, rec *store.Record) (*store.Record, error) {
	head, size, ok := envelopeHead(rec.Body)
	if !ok {
		return nil, &Unreadable{Reason: "malformed"}
	}
	id := [keyIDLen]byte(head[1 : 1+keyIDLen])
	hexID := hex.EncodeToString(id[:])
	key, ok := r.byID(id)
	if !ok {
		return nil, &Unreadable{Reason: "unknown_key", KeyID: hexID}
	}
	sealed := rec.Body[len(head):]
	nonceLen := key.aead.NonceSize()
	if len(sealed) < nonceLen+key.aead.Overhead() {
		return nil, &Unreadable{Reason: "malformed", KeyID: hexID}
	}
	plain, err := key.aead.Open(nil, sealed[:nonceLen], sealed[nonceLen:], sealAAD(k, rec, head))
	if err != nil {
		return nil, &Unreadable{Reason: "authentication", KeyID: hexID}
	}
	inner, err := store.DecodeRecord(plain)
	if err != nil || len(inner.Body) != size {
		// authenticated, so written by a sealer that disagrees with this one
		return nil, &Unreadable{Reason: "malformed", KeyID: hexID}
	}
	out := *rec
	out.Header, out.Body, out.Sealed = inner.Header, inner.Body, false
	return &out, nil
}

// envelopeHead splits the head off a sealed body, with the sealed size.
func envelopeHead(body []byte) (head []byte, size int, ok bool) {
	if len(body) < 1+keyIDLen || body[0] != sealFormat {
		return nil, 0, false
	}
	n, w := binary.Uvarint(body[1+keyIDLen:])
	if w <= 0 || n > math.MaxInt32 {
		return nil, 0, false
	}
	return body[:1+keyIDLen+w], int(n), true
}

// BodySize is the size of rec's response body, sealed or not.
func BodySize(rec *store.Record) int {
	if rec.Sealed {
		if _, n, ok := envelopeHead(rec.Body); ok {
			return n
		}
	}
	return len(rec.Body)
}

// sealAAD is the associated data of a sealed record: its key hash and all
// that the record keeps in the clear (status, state and flags, fingerprint,
// endpoint, the envelope's head), so that none of it changes unseen. The
// handler compares endpoint and fingerprint with the request's, but in the
// store they could be changed to match another request's.
func sealAAD(k store.Key, rec *store.Record, head []byte) []byte {
	aad := make([]byte, 0, len(k)+4+len(rec.Fingerprint)+binary.MaxVarintLen64+len(rec.Endpoint)+len(head))
	aad = append(aad, k[:]...)
	aad = binary.BigEndian.AppendUint16(aad, uint16(rec.Status))
	aad = append(aad, byte(rec.State), rec.Flags())
	aad = append(aad, rec.Fingerprint[:]...)
	aad = binary.AppendUvarint(aad, uint64(len(rec.Endpoint))) // so that endpoint and head cannot trade bytes
	aad = append(aad, rec.Endpoint...)
	return append(aad, head...)
}
