// Package fingerprint is what a key is bound to: the endpoint a request
// was sent to, and the fingerprint of its payload (the fingerprint modes).
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// digest is a pooled SHA-256 with scratch space: arrays on the stack
// written through hash.Hash would escape to the heap.
type digest struct {
	hash.Hash
	n   [8]byte
	sum [sha256.Size]byte
	buf []byte // strings go through it: the hash is no io.StringWriter
}

// Kept (issue 36): sha256.New per request cost 1.08 and 1.22 times the CPU
// per memory-store new key under bench/compare.sh (docs/performance.md).
var digests = sync.Pool{New: func() any { return &digest{Hash: sha256.New()} }}

// The values of the fingerprint option.
const (
	Body = "body"
	JSON = "json"
	None = "none"
)

// fingerprintMode is the fingerprint option, parsed once.
type fingerprintMode uint8

const (
	modeBody fingerprintMode = iota + 1
	modeJSON
	modeNone
)

var fingerprintModes = map[string]fingerprintMode{
	Body: modeBody,
	JSON: modeJSON,
	None: modeNone,
}

// Payload is what a handler's fingerprint reads of a request.
type Payload struct {
	mode    fingerprintMode
	ignore  *canonjson.Ignore // json mode's fingerprint_ignore; nil when none
	only    *Selection        // json mode's fingerprint_only; nil when none
	headers []string          // fingerprint_headers, canonical, sorted, each once
}

// NewPayload compiles the json mode's fingerprint_ignore, and sorts and
// dedupes the header names so that their order or case does not matter.
func NewPayload(mode string, ignore, only, headers []string) (Payload, error) {
	p := Payload{mode: fingerprintModes[mode]}
	if p.mode == modeJSON && len(only) > 0 {
		var err error
		if p.only, err = NewSelection(only); err != nil {
			return p, fmt.Errorf("fingerprint_only: %w", err)
		}
	}
	if p.mode == modeJSON && len(ignore) > 0 {
		var err error
		if p.ignore, err = canonjson.Compile(ignore); err != nil {
			return p, err
		}
	}
	for _, name := range headers {
		p.headers = append(p.headers, textproto.CanonicalMIMEHeaderKey(name))
	}
	slices.Sort(p.headers)
	p.headers = slices.Compact(p.headers)
	return p, nil
}

// A fingerprint is a layout word, then fields that are each a fixed-size
// tag or word, or length-prefixed, so that no request's parts can pass for
// another's, across modes too:
//
//	body mode: layout word, headers, query, body
//	json mode: layout word, headers, query (params or raw), body (canonical,
//	           the selected values of fingerprint_only, or raw)
//	none mode: layout word, headers
//	headers:   count; per name: name, count of lines, each line
//	params:    count; per parameter: name, value (decoded)
//
// Lengths and counts are 8-byte big-endian words; tags tell raw from canonical.
const (
	layoutBody uint64 = 1<<63 | (iota + 1)
	layoutJSON
	layoutNone
)

// Tags of the json mode's fields.
const (
	tagParams    = 'p' // the query as a sorted set of decoded parameters
	tagRawQuery  = 'q' // the query as sent: it has an invalid escape
	tagCanonical = 'c' // the body's canonical JSON form
	tagRawBody   = 'b' // the body as sent: it is not valid JSON
)

// ReadsBody says whether the fingerprint reads the body (all modes but none).
func (p *Payload) ReadsBody() bool { return p.mode != modeNone }

// Of hashes r's payload; b is its buffered body (nil if empty or in none mode).
func (p *Payload) Of(r *http.Request, b []byte) store.Fingerprint {
	d := digests.Get().(*digest)
	defer d.release()
	d.Reset()
	switch p.mode {
	case modeJSON:
		d.word(layoutJSON)
	case modeNone:
		d.word(layoutNone)
	default:
		d.word(layoutBody)
	}
	d.headers(r.Header, p.headers)
	switch p.mode {
	case modeJSON:
		d.query(r.URL.RawQuery)
		if p.only != nil {
			if !d.selected(b, p.only) {
				d.tag(tagRawBody)
				d.field(b)
			}
		} else if !canonjson.Write((*canonicalBody)(d), b, p.ignore) {
			d.tag(tagRawBody)
			d.field(b)
		}
	case modeNone:
	default:
		d.string(r.URL.RawQuery)
		d.field(b)
	}
	return store.Fingerprint(d.Sum(d.sum[:0]))
}

const maxScratch = 64 << 10 // so a huge query or header does not pin pool memory

func (d *digest) release() {
	if cap(d.buf) > maxScratch {
		d.buf = nil
	}
	digests.Put(d)
}

func (d *digest) word(n uint64) {
	binary.BigEndian.PutUint64(d.n[:], n)
	d.Write(d.n[:])
}

func (d *digest) tag(t byte) {
	d.n[0] = t
	d.Write(d.n[:1])
}

func (d *digest) field(b []byte) {
	d.word(uint64(len(b)))
	d.Write(b)
}

func (d *digest) string(s string) {
	d.buf = append(d.buf[:0], s...)
	d.field(d.buf)
}

func (d *digest) headers(hdr http.Header, names []string) {
	d.word(uint64(len(names)))
	for _, name := range names {
		d.string(name)
		lines := hdr[name]
		d.word(uint64(len(lines))) // 0: absent, which differs from one empty line
		for _, v := range lines {
			d.string(v)
		}
	}
}

// canonicalBody is the writer canonjson.Write hands the canonical form to,
// in one call: a tagged field, without copying it to learn its length.
type canonicalBody digest

func (c *canonicalBody) Write(p []byte) (int, error) {
	d := (*digest)(c)
	d.tag(tagCanonical)
	d.field(p)
	return len(p), nil
}

// query writes the query's parameters sorted by name, a repeated name's
// values in order (a=1&a=2 is not a=2&a=1). As most frameworks do, empty
// parameters (a&&b) are skipped and a bare name has an empty value. A query
// with an invalid escape is written as sent.
func (d *digest) query(q string) {
	var params [][2]string
	for pair := range strings.SplitSeq(q, "&") {
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		name, err1 := url.QueryUnescape(name)
		value, err2 := url.QueryUnescape(value)
		if err1 != nil || err2 != nil {
			d.tag(tagRawQuery)
			d.string(q)
			return
		}
		params = append(params, [2]string{name, value})
	}
	slices.SortStableFunc(params, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	d.tag(tagParams)
	d.word(uint64(len(params)))
	for _, p := range params {
		d.string(p[0])
		d.string(p[1])
	}
}
