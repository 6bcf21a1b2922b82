package store

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"net/http"
	"strings"
	"time"
)

// The binary record format shared by the backends that keep records as
// opaque values (Redis, the file store, the memory store). It is compact,
// holds the body as raw bytes, and starts with a fixed head, so that a
// store, or a script on its server, can check a claim's owner or pick out
// claims without decoding the rest:
//
//	0      magic 'I'
//	1      state
//	2:18   owner token
//	18:50  fingerprint
//	50:58  created at, Unix nanoseconds, big endian
//	58:60  status, big endian
//	60     flags (bit 0: truncated; bit 1: outcome unknown; bit 2: expiry
//	       follows; bit 3: watched)
//	61:69  with bit 2 only: expires at, Unix nanoseconds, big endian
//	then   uvarint-prefixed endpoint, uvarint header count, then per header
//	       a prefixed name, a value count and prefixed values; the body is
//	       the rest.
//
// Records written before the expiry existed lack bit 2 and decode with a
// zero ExpiresAt.
//
// The first OwnerLen bytes (magic, state, token) are the owner prefix.
const (
	magic          = 'I'
	stateOff       = 1
	tokenOff       = 2
	fingerprintOff = OwnerLen
	createdOff     = fingerprintOff + len(Fingerprint{})
	statusOff      = createdOff + 8
	flagsOff       = statusOff + 2
	fixedLen       = flagsOff + 1

	flagTruncated      = 1
	flagOutcomeUnknown = 2
	flagExpires        = 4
	expiresLen         = 8
)

// FlagsOffset is the offset of the flags byte, and FlagWatched the flag
// that marks an in-progress claim a duplicate waits for. A store whose
// server edits values in place (the Redis store's scripts) sets it on the
// live claim, so that whoever ends the claim knows to announce the end.
// Decoding ignores it.
const (
	FlagsOffset = flagsOff
	FlagWatched = 8
)

// OwnerLen is the length of the owner prefix that starts every record: its
// magic, state and owner token. A record starts with AppendOwner(dst,
// token) exactly when it is an in-progress claim held by token, so a
// script checks ownership with one compare of OwnerLen bytes, whatever the
// size of the record.
const OwnerLen = tokenOff + len(Token{})

// AppendOwner appends the owner prefix of an in-progress claim held by
// token.
func AppendOwner(dst []byte, token Token) []byte {
	dst = append(dst, magic, byte(InProgress))
	return append(dst, token[:]...)
}

// StatePrefix is how every record in state s starts: its magic and state
// byte, so that a script tells a record's state with one compare.
func StatePrefix(s State) []byte { return []byte{magic, byte(s)} }

// Encoded is a record as AppendRecord writes it. Its methods read the fixed
// head alone, for stores that check a claim's owner or list claims without
// decoding whole records. Bytes too short to hold the head, or without the
// magic, are no record: their State is 0.
type Encoded []byte

func (b Encoded) hasHead() bool { return len(b) >= fixedLen && b[0] == magic }

// State is the record's state, or 0 if b is not a record.
func (b Encoded) State() State {
	if !b.hasHead() {
		return 0
	}
	return State(b[stateOff])
}

// ClaimedBy reports whether b is an in-progress claim held by token.
func (b Encoded) ClaimedBy(token Token) bool {
	return b.State() == InProgress && Token(b[tokenOff:OwnerLen]) == token
}

// CreatedAt is when the record's key was claimed; zero if b is not a
// record.
func (b Encoded) CreatedAt() time.Time {
	if !b.hasHead() {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b[createdOff:statusOff])))
}

// ExpiresAt is when the record expires, as its writer noted it; zero if b
// is not a record or carries no expiry.
func (b Encoded) ExpiresAt() time.Time {
	if !b.hasHead() || b[flagsOff]&flagExpires == 0 || len(b) < fixedLen+expiresLen {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b[fixedLen:])))
}

// ErrCorrupt is returned by DecodeRecord for bytes it did not write.
var ErrCorrupt = errors.New("corrupt idempotency record")

// AppendRecord appends the encoding of rec to dst.
func AppendRecord(dst []byte, rec *Record) []byte {
	dst = append(dst, magic, byte(rec.State))
	dst = append(dst, rec.Token[:]...)
	dst = append(dst, rec.Fingerprint[:]...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(rec.CreatedAt.UnixNano()))
	dst = binary.BigEndian.AppendUint16(dst, uint16(rec.Status))
	var flags byte
	if rec.Truncated {
		flags |= flagTruncated
	}
	if rec.OutcomeUnknown {
		flags |= flagOutcomeUnknown
	}
	if !rec.ExpiresAt.IsZero() {
		flags |= flagExpires
	}
	dst = append(dst, flags)
	if flags&flagExpires != 0 {
		dst = binary.BigEndian.AppendUint64(dst, uint64(rec.ExpiresAt.UnixNano()))
	}
	dst = appendString(dst, rec.Endpoint)
	dst = binary.AppendUvarint(dst, uint64(len(rec.Header)))
	for name, values := range rec.Header {
		dst = appendString(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(values)))
		for _, v := range values {
			dst = appendString(dst, v)
		}
	}
	return append(dst, rec.Body...)
}

// AppendClaim appends the encoding of the in-progress record for c, claimed
// at now. Like AppendCompleted, it grows dst to the exact size first, so
// that a record kept as its encoding wastes no capacity.
func AppendClaim(dst []byte, c *Claim, now time.Time) []byte {
	return AppendRecord(grow(dst, encodedLen(c.Endpoint, nil)), &Record{
		State:       InProgress,
		Token:       c.Token,
		Endpoint:    c.Endpoint,
		Fingerprint: c.Fingerprint,
		CreatedAt:   now,
	})
}

// AppendCompleted appends the encoding of the completed record that
// replaces the claim c: c's binding (token, endpoint, fingerprint, creation
// time) with the response in rec (Status, Header, Body, Truncated,
// OutcomeUnknown) and its expiry, rec.ExpiresAt, if set.
func AppendCompleted(dst []byte, c *Claim, rec *Record) []byte {
	return AppendRecord(grow(dst, encodedLen(c.Endpoint, rec)), &Record{
		State:          Completed,
		Token:          c.Token,
		Endpoint:       c.Endpoint,
		Fingerprint:    c.Fingerprint,
		CreatedAt:      c.CreatedAt,
		Status:         rec.Status,
		Header:         rec.Header,
		Body:           rec.Body,
		Truncated:      rec.Truncated,
		OutcomeUnknown: rec.OutcomeUnknown,
		ExpiresAt:      rec.ExpiresAt,
	})
}

// grow makes room for n more bytes in dst, allocating exactly that much when
// it must.
func grow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	return append(make([]byte, 0, len(dst)+n), dst...)
}

// encodedLen is the length of the encoding of a record with endpoint and
// the response in rec (nil for a claim).
func encodedLen(endpoint string, rec *Record) int {
	n := fixedLen + prefixed(len(endpoint))
	if rec == nil {
		return n + uvarintLen(0)
	}
	n += uvarintLen(len(rec.Header)) + len(rec.Body)
	if !rec.ExpiresAt.IsZero() {
		n += expiresLen
	}
	for name, values := range rec.Header {
		n += prefixed(len(name)) + uvarintLen(len(values))
		for _, v := range values {
			n += prefixed(len(v))
		}
	}
	return n
}

// prefixed is the length of a uvarint-prefixed string of n bytes.
func prefixed(n int) int { return uvarintLen(n) + n }

func uvarintLen(n int) int { return (bits.Len64(uint64(n)|1) + 6) / 7 }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// DecodeRecord decodes what AppendRecord wrote. The returned body aliases b.
// Replays decode a record on every request, so the strings (endpoint,
// header names and values) share one allocation, and the header values one
// slice: four allocations whatever the number of headers.
func DecodeRecord(b []byte) (*Record, error) {
	rec := &Record{State: Encoded(b).State()}
	if rec.State != InProgress && rec.State != Completed {
		return nil, ErrCorrupt
	}
	copy(rec.Token[:], b[tokenOff:OwnerLen])
	copy(rec.Fingerprint[:], b[fingerprintOff:createdOff])
	rec.CreatedAt = Encoded(b).CreatedAt()
	rec.Status = int(binary.BigEndian.Uint16(b[statusOff:flagsOff]))
	rec.Truncated = b[flagsOff]&flagTruncated != 0
	rec.OutcomeUnknown = b[flagsOff]&flagOutcomeUnknown != 0
	start := fixedLen
	if b[flagsOff]&flagExpires != 0 {
		if len(b) < fixedLen+expiresLen {
			return nil, ErrCorrupt
		}
		rec.ExpiresAt = Encoded(b).ExpiresAt()
		start += expiresLen
	}

	// Validate, and size the shared string and value slice.
	d := decoder{b: b[start:]}
	text := len(d.bytes())
	headers := d.count()
	values := 0
	for range headers {
		text += len(d.bytes())
		n := d.count()
		values += n
		for range n {
			text += len(d.bytes())
		}
	}
	if d.err {
		return nil, ErrCorrupt
	}
	if len(d.b) > 0 {
		rec.Body = d.b
	}

	// Copy every string into one; the builder was sized to hold them all,
	// so String does not copy them again.
	var sb strings.Builder
	sb.Grow(text)
	d = decoder{b: b[start:]}
	sb.Write(d.bytes())
	for range d.count() {
		sb.Write(d.bytes())
		for range d.count() {
			sb.Write(d.bytes())
		}
	}
	all := sb.String()

	// Then slice it, walking the same fields again.
	d = decoder{b: b[start:]}
	next := func() string {
		n := len(d.bytes())
		s := all[:n]
		all = all[n:]
		return s
	}
	rec.Endpoint = next()
	d.count() // headers, read above
	if headers > 0 {
		rec.Header = make(http.Header, headers)
		vals := make([]string, values)
		for range headers {
			name := next()
			n := d.count()
			vs := vals[:n:n]
			vals = vals[n:]
			for j := range vs {
				vs[j] = next()
			}
			rec.Header[name] = vs
		}
	}
	return rec, nil
}

// decoder reads uvarint-prefixed fields and remembers the first error, so
// that the caller checks once.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) uvarint() uint64 {
	if d.err {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads an element count, bounded by the bytes left (every element
// takes at least one byte), so corrupt input cannot make a huge allocation.
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.err = true
		return 0
	}
	return int(v)
}

// bytes reads a length-prefixed field; it aliases the input.
func (d *decoder) bytes() []byte {
	n := d.count()
	if d.err {
		return nil
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s
}
