package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Encryption at rest (encryption_keys): a completed record's response
// headers and body are sealed with AES-256-GCM before any store sees them,
// and opened when the record is about to be replayed. What the stores,
// inspect, stuck and purges read stays as it was (state, status, sizes,
// times, endpoint, fingerprint), so no store's schema changes: the sealed
// record's header map holds one entry, store.SealedHeader, with the format,
// the key's id and the body's size, and its body holds the nonce and the
// ciphertext of every header (whatever its name, trailers included) and
// the body. The associated data binds the ciphertext to the record's key
// hash, status and that entry: a record copied under another key, or
// given another status, does not open.
const sealFormat = "v1" // AES-256-GCM, 12-byte random nonce first

// sealing seals the responses its store completes and opens the records
// its store returns. It wraps every handler's store, with or without keys:
// a sealed record that no configured key opens, because the keys were
// dropped or the record was changed, is refused, never replayed as
// ciphertext and never run again.
type sealing struct {
	store.Store
	keys *keyring // nil: no encryption_keys, nothing is sealed
}

func sealStore(s store.Store, keys *keyring) *sealing {
	return &sealing{Store: s, keys: keys}
}

// unreadableRecord is the error Acquire returns for a sealed record that
// would be replayed to the claim but does not open.
type unreadableRecord struct {
	reason string // unknown_key, authentication or malformed: a metric label
	keyID  string // the id the record names; empty if malformed
}

func (e *unreadableRecord) Error() string {
	switch e.reason {
	case "unknown_key":
		return "opening the stored response: sealed with key id " + e.keyID + ", which no configured key has"
	case "authentication":
		return "opening the stored response: authentication failed with key id " + e.keyID + " (the record was changed, or copied from another key)"
	}
	return "opening the stored response: malformed sealed record"
}

func (s *sealing) Acquire(ctx context.Context, k store.Key, c *store.Claim) (*store.Record, error) {
	rec, err := s.Store.Acquire(ctx, k, c)
	if err != nil || rec == nil {
		return rec, err
	}
	marker, sealed := rec.Header[store.SealedHeader]
	if !sealed {
		// a claim, a record without a response, or one stored before
		// encryption was turned on: nothing to open
		return rec, nil
	}
	if !boundTo(rec, c) {
		// refused with 422 whatever it holds: no need to open it
		out := *rec
		out.Header, out.Body = nil, nil
		return &out, nil
	}
	return s.keys.open(k, rec, marker)
}

func (s *sealing) Complete(ctx context.Context, k store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	if s.keys == nil || rec.Truncated || rec.OutcomeUnknown {
		return s.Store.Complete(ctx, k, c, rec, ttl)
	}
	sealed, err := s.keys.seal(k, rec)
	if err != nil {
		return err
	}
	return s.Store.Complete(ctx, k, c, sealed, ttl)
}

// seal returns a copy of rec whose headers and body are sealed with the
// first key.
func (r *keyring) seal(k store.Key, rec *store.Record) (*store.Record, error) {
	key := r.keys[0]
	marker := sealFormat + " " + key.id + " " + strconv.Itoa(len(rec.Body))
	nonceLen := key.aead.NonceSize()
	// nonce, then the plaintext, sealed in place
	buf := make([]byte, nonceLen, nonceLen+len(rec.Body)+256+key.aead.Overhead())
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("sealing the response: %w", err)
	}
	buf = store.AppendRecord(buf, &store.Record{State: store.Completed, Header: rec.Header, Body: rec.Body})
	nonce, plain := buf[:nonceLen], buf[nonceLen:]
	body := key.aead.Seal(buf[:nonceLen], nonce, plain, sealAAD(k, rec.Status, marker))
	return &store.Record{
		Status:    rec.Status,
		Header:    http.Header{store.SealedHeader: {marker}},
		Body:      body,
		ExpiresAt: rec.ExpiresAt,
	}, nil
}

// open returns a copy of rec with the headers and body that marker says
// are sealed in its body.
func (r *keyring) open(k store.Key, rec *store.Record, marker []string) (*store.Record, error) {
	if len(marker) != 1 {
		return nil, &unreadableRecord{reason: "malformed"}
	}
	format, rest, _ := strings.Cut(marker[0], " ")
	id, size, _ := strings.Cut(rest, " ")
	if format != sealFormat || id == "" {
		return nil, &unreadableRecord{reason: "malformed"}
	}
	key, ok := r.byID(id)
	if !ok {
		return nil, &unreadableRecord{reason: "unknown_key", keyID: id}
	}
	nonceLen := key.aead.NonceSize()
	if len(rec.Body) < nonceLen+key.aead.Overhead() {
		return nil, &unreadableRecord{reason: "malformed", keyID: id}
	}
	plain, err := key.aead.Open(nil, rec.Body[:nonceLen], rec.Body[nonceLen:], sealAAD(k, rec.Status, marker[0]))
	if err != nil {
		return nil, &unreadableRecord{reason: "authentication", keyID: id}
	}
	inner, err := store.DecodeRecord(plain)
	if err != nil || strconv.Itoa(len(inner.Body)) != size {
		// authenticated, so written by a sealer that disagrees with this one
		return nil, &unreadableRecord{reason: "malformed", keyID: id}
	}
	out := *rec
	out.Header, out.Body = inner.Header, inner.Body
	return &out, nil
}

// sealAAD is the associated data of a sealed response: the record's key
// hash, its status and its marker.
func sealAAD(k store.Key, status int, marker string) []byte {
	aad := make([]byte, 0, len(k)+2+len(marker))
	aad = append(aad, k[:]...)
	aad = binary.BigEndian.AppendUint16(aad, uint16(status))
	return append(aad, marker...)
}

// refuseUnreadable answers a request whose key holds a sealed response
// that does not open. The request ran once already: it is not run again,
// and the response is not replayed.
func (h *Handler) refuseUnreadable(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, key store.Key, u *unreadableRecord) error {
	h.metrics.unreadable(u.reason)
	h.logger.Error("the stored response cannot be opened with the configured encryption_keys; refusing the request without running it again",
		zap.String("key_hash", key.String()), zap.String("reason", u.reason),
		zap.String("key_id", u.keyID), zap.Strings("configured_key_ids", h.keys.ids()))
	return h.refuse(w, r, repl, resultError, h.problems.unreadable)
}

// Interface guard
var _ store.Store = (*sealing)(nil)
