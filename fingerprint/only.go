package fingerprint

import (
	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
)

// tagSelected marks a json-mode body fingerprinted by fingerprint_only:
// per pointer, in the configured order, how many values it matched and
// the canonical form of each, in document order, an object's members in
// key order (an absent member matches none, which differs from a null).
const tagSelected = 's'

// Selection is what canonjson reads of a body for fingerprint_only, or
// for key_from json: the pointers, with * matching every member or
// element as in fingerprint_ignore, and the filter that keeps only what
// they match, so that the rest of a large body costs its reading alone.
type Selection struct {
	Pointers [][]string // the pointers' tokens
	filter   *canonjson.Ignore
}

// NewSelection compiles pointers, RFC 6901 JSON pointers.
func NewSelection(pointers []string) (*Selection, error) {
	s := &Selection{Pointers: make([][]string, len(pointers))}
	for i, p := range pointers {
		tokens, err := canonjson.ParsePointer(p)
		if err != nil {
			return nil, err
		}
		s.Pointers[i] = tokens
	}
	var err error
	s.filter, err = canonjson.CompileOnly(pointers)
	return s, err
}

// selected writes body's selected values into d; false when body is not
// JSON, which is then fingerprinted raw.
func (d *digest) selected(body []byte, only *Selection) bool {
	doc, ok := canonjson.Parse(body, only.filter)
	if !ok {
		return false
	}
	defer doc.Close()
	d.tag(tagSelected)
	for _, ptr := range only.Pointers {
		var n uint64
		doc.Values(ptr, func([]byte) { n++ })
		d.word(n)
		doc.Values(ptr, func(v []byte) { (*canonicalBody)(d).Write(v) })
	}
	return true
}

// Member is the string that s's one pointer names in body, a JSON
// document (key_from json); ok is false when body is not JSON or the
// member is not there.
func (s *Selection) Member(body []byte) (string, bool) {
	doc, ok := canonjson.Parse(body, s.filter)
	if !ok {
		return "", false
	}
	defer doc.Close()
	return doc.Member(s.Pointers[0])
}
