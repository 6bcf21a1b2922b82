package idempotency

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
)

// tagSelected marks a json-mode body fingerprinted by fingerprint_only:
// per pointer, in the configured order, how many values it matched and
// the canonical form of each, in document order (an absent member matches
// none, which differs from a null).
const tagSelected = 's'

// compileOnly turns fingerprint_only's pointers into their tokens; "*"
// matches every member or element, as in fingerprint_ignore.
func compileOnly(pointers []string) ([][]string, error) {
	only := make([][]string, len(pointers))
	for i, p := range pointers {
		tokens, err := canonjson.ParsePointer(p)
		if err != nil {
			return nil, err
		}
		only[i] = tokens
	}
	return only, nil
}

// selected writes body's selected values into d; false when body is not
// JSON, which is then fingerprinted raw. Objects are read with
// encoding/json, whose objects keep a repeated member's last value.
func (d *digest) selected(body []byte, only [][]string) bool {
	if !json.Valid(body) {
		return false
	}
	d.tag(tagSelected)
	var matches []json.RawMessage
	for _, ptr := range only {
		matches = collect(matches[:0], body, ptr)
		d.word(uint64(len(matches)))
		for _, m := range matches {
			if !canonjson.Write((*canonicalBody)(d), m, nil) {
				return false
			}
		}
	}
	return true
}

// collect appends the values at ptr in doc to dst.
func collect(dst []json.RawMessage, doc json.RawMessage, ptr []string) []json.RawMessage {
	if len(ptr) == 0 {
		return append(dst, doc)
	}
	tok, rest := ptr[0], ptr[1:]
	var members map[string]json.RawMessage
	if json.Unmarshal(doc, &members) == nil {
		if tok == "*" {
			for _, k := range slices.Sorted(maps.Keys(members)) {
				dst = collect(dst, members[k], rest)
			}
		} else if v, ok := members[tok]; ok {
			dst = collect(dst, v, rest)
		}
		return dst
	}
	var elems []json.RawMessage
	if json.Unmarshal(doc, &elems) != nil {
		return dst
	}
	if tok == "*" {
		for _, e := range elems {
			dst = collect(dst, e, rest)
		}
		return dst
	}
	if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(elems) && tok == strconv.Itoa(i) {
		dst = collect(dst, elems[i], rest)
	}
	return dst
}
