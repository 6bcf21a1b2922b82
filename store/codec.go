package store

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"net/http"
	"time"
)

// The binary record format of the stores that keep records as opaque
// values (Redis, file, memory). Its fixed head lets a store, or a script on
// its server, check a claim's owner or pick out claims without decoding:
//
//	0      magic 'I'
//	1      state
//	2:18   owner token
//	18:50  fingerprint
//	50:58  created at, Unix nanoseconds, big endian
//	58:66  expires at, Unix nanoseconds, big endian (0 for a claim)
//	66:68  status, big endian
//	68     flags (bit 0: truncated; bit 1: outcome unknown; bit 2: sealed;
//	       bit 3: watched)
//	then   the text: a uvarint length, then the prefixed endpoint and the
//	       header (AppendHeader); the body is the rest.
const (
	magic          = 'I'
	stateOff       = 1
	tokenOff       = 2
	fingerprintOff = OwnerLen
	createdOff     = fingerprintOff + len(Fingerprint{})
	expiresOff     = createdOff + 8
	statusOff      = expiresOff + 8
	flagsOff       = statusOff + 2
	fixedLen       = flagsOff + 1

	flagTruncated      = 1
	flagOutcomeUnknown = 2
	flagSealed         = 4
)

// FlagsOffset is the offset of the flags byte. FlagWatched, which decoding
// ignores, marks a claim a duplicate waits for, so that whoever ends it in
// place on the server (Redis) announces the end.
const (
	FlagsOffset = flagsOff
	FlagWatched = 8
)

// OwnerLen is the length of the owner prefix (magic, state, token): a
// record starts with AppendOwner(nil, token) exactly when it is a claim
// held by token, so a script checks ownership with one compare.
const OwnerLen = tokenOff + len(Token{})

// AppendOwner appends the owner prefix of a claim held by token.
func AppendOwner(dst []byte, token Token) []byte {
	dst = append(dst, magic, byte(InProgress))
	return append(dst, token[:]...)
}

// StatePrefix is how every record in state s starts, so that a script
// tells a record's state with one compare.
func StatePrefix(s State) []byte { return []byte{magic, byte(s)} }

// Encoded is a record as AppendRecord writes it. Its methods read the fixed
// head alone; bytes without a head are no record: their State is 0.
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

// CreatedAt is when the record's key was claimed; zero if b is no record.
func (b Encoded) CreatedAt() time.Time { return b.time(createdOff) }

// ExpiresAt is when a completed record expires, as its writer noted it;
// zero for a claim, or if b is no record.
func (b Encoded) ExpiresAt() time.Time { return b.time(expiresOff) }

// time reads a time written by appendTime: 0 is the zero time.
func (b Encoded) time(off int) time.Time {
	if !b.hasHead() || binary.BigEndian.Uint64(b[off:]) == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b[off:])))
}

func appendTime(dst []byte, t time.Time) []byte {
	var ns uint64
	if !t.IsZero() {
		ns = uint64(t.UnixNano())
	}
	return binary.BigEndian.AppendUint64(dst, ns)
}

// ErrCorrupt is returned by DecodeRecord for bytes it did not write.
var ErrCorrupt = errors.New("corrupt idempotency record")

// AppendRecord appends the encoding of rec to dst, grown to the exact size
// first, so that a record kept as its encoding wastes no capacity.
func AppendRecord(dst []byte, rec *Record) []byte {
	text := prefixed(len(rec.Endpoint)) + headerLen(rec.Header)
	if n := fixedLen + uvarintLen(text) + text + len(rec.Body); cap(dst)-len(dst) < n {
		dst = append(make([]byte, 0, len(dst)+n), dst...)
	}
	dst = append(dst, magic, byte(rec.State))
	dst = append(dst, rec.Token[:]...)
	dst = append(dst, rec.Fingerprint[:]...)
	dst = appendTime(dst, rec.CreatedAt)
	dst = appendTime(dst, rec.ExpiresAt)
	dst = binary.BigEndian.AppendUint16(dst, uint16(rec.Status))
	dst = append(dst, rec.Flags())
	dst = binary.AppendUvarint(dst, uint64(text))
	dst = appendString(dst, rec.Endpoint)
	dst = AppendHeader(dst, rec.Header)
	return append(dst, rec.Body...)
}

// Flags packs rec's truncated, outcome-unknown and sealed flags as the
// head keeps them.
func (rec *Record) Flags() byte {
	var flags byte
	if rec.Truncated {
		flags |= flagTruncated
	}
	if rec.OutcomeUnknown {
		flags |= flagOutcomeUnknown
	}
	if rec.Sealed {
		flags |= flagSealed
	}
	return flags
}

// AppendClaim appends the encoding of the in-progress record of c.
func AppendClaim(dst []byte, c *Claim) []byte {
	return AppendRecord(dst, &Record{
		State: InProgress, Token: c.Token, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint, CreatedAt: c.CreatedAt,
	})
}

// AppendCompleted appends the encoding of the completed record that
// replaces the claim c: c's binding with resp, expiring at expires.
func AppendCompleted(dst []byte, c *Claim, resp *Response, expires time.Time) []byte {
	return AppendRecord(dst, &Record{
		State: Completed, Token: c.Token, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint, CreatedAt: c.CreatedAt,
		Response: *resp, ExpiresAt: expires,
	})
}

// AppendHeader appends h: uvarint counts of names and of values, then per
// name the prefixed name, its count of values and each value prefixed.
func AppendHeader(dst []byte, h http.Header) []byte {
	values := 0
	for _, vs := range h {
		values += len(vs)
	}
	dst = binary.AppendUvarint(dst, uint64(len(h)))
	dst = binary.AppendUvarint(dst, uint64(values))
	for name, vs := range h {
		dst = appendString(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(vs)))
		for _, v := range vs {
			dst = appendString(dst, v)
		}
	}
	return dst
}

// headerLen is the length of AppendHeader's encoding of h.
func headerLen(h http.Header) int {
	n, values := 0, 0
	for name, vs := range h {
		n += prefixed(len(name)) + uvarintLen(len(vs))
		values += len(vs)
		for _, v := range vs {
			n += prefixed(len(v))
		}
	}
	return n + uvarintLen(len(h)) + uvarintLen(values)
}

// DecodeHeader decodes what AppendHeader wrote, the whole of b. Its strings
// share one copy of b, and its values one slice.
func DecodeHeader(b []byte) (http.Header, error) {
	d := decoder{b: b, text: string(b)}
	h := d.header()
	if d.err || d.i != len(b) {
		return nil, ErrCorrupt
	}
	return h, nil
}

// DecodeRecord decodes what AppendRecord wrote. The returned body aliases
// b; the strings share one copy of the record's text.
func DecodeRecord(b []byte) (*Record, error) {
	e := Encoded(b)
	rec := &Record{State: e.State()}
	if rec.State != InProgress && rec.State != Completed {
		return nil, ErrCorrupt
	}
	copy(rec.Token[:], b[tokenOff:OwnerLen])
	copy(rec.Fingerprint[:], b[fingerprintOff:createdOff])
	rec.CreatedAt, rec.ExpiresAt = e.CreatedAt(), e.ExpiresAt()
	rec.Status = int(binary.BigEndian.Uint16(b[statusOff:flagsOff]))
	flags := b[flagsOff]
	rec.Truncated = flags&flagTruncated != 0
	rec.OutcomeUnknown = flags&flagOutcomeUnknown != 0
	rec.Sealed = flags&flagSealed != 0

	n, w := binary.Uvarint(b[fixedLen:])
	start := fixedLen + w
	if w <= 0 || n > uint64(len(b)-start) {
		return nil, ErrCorrupt
	}
	end := start + int(n)
	d := decoder{b: b[start:end], text: string(b[start:end])}
	rec.Endpoint = d.string()
	rec.Header = d.header()
	if d.err || d.i != len(d.b) {
		return nil, ErrCorrupt
	}
	if end < len(b) {
		rec.Body = b[end:]
	}
	return rec, nil
}

// prefixed is the length of a uvarint-prefixed string of n bytes.
func prefixed(n int) int { return uvarintLen(n) + n }

func uvarintLen(n int) int { return (bits.Len64(uint64(n)|1) + 6) / 7 }

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decoder reads the fields of b, slicing its strings from text, a copy of
// b; the caller checks err once at the end.
type decoder struct {
	b    []byte
	text string
	i    int
	err  bool
}

// count reads a uvarint count, bounded by the bytes left (every element
// takes one at least), so corrupt input cannot make a huge allocation.
func (d *decoder) count() int {
	if d.err {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.i:])
	if n <= 0 || v > uint64(len(d.b)-d.i-n) {
		d.err = true
		return 0
	}
	d.i += n
	return int(v)
}

func (d *decoder) string() string {
	n := d.count()
	if d.err {
		return ""
	}
	s := d.text[d.i : d.i+n]
	d.i += n
	return s
}

func (d *decoder) header() http.Header {
	names, values := d.count(), d.count()
	if d.err || names == 0 {
		return nil
	}
	h := make(http.Header, names)
	vals := make([]string, values)
	for range names {
		name := d.string()
		n := d.count()
		if n > len(vals) {
			d.err = true
		}
		if d.err {
			return nil
		}
		vs := vals[:n:n]
		vals = vals[n:]
		for i := range vs {
			vs[i] = d.string()
		}
		h[name] = vs
	}
	return h
}
