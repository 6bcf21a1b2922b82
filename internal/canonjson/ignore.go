package canonjson

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Ignore is a set of JSON pointers whose members and array elements the
// canonical form leaves out, as if they were absent. A nil *Ignore leaves
// nothing out. It is safe for concurrent use.
type Ignore struct {
	pointers [][]string // each pointer's tokens
	// only inverts the pointers: they name what is kept, and everything
	// off their paths is left out (CompileOnly).
	only bool
}

// The state of a value, as the parser carries it down: dropped, kept, or
// matching, when a pointer may still match the path to a value below it
// (the path is the parser's).
const (
	dropped  = -2 // the value is left out, and everything below it
	kept     = -1 // nothing below the value is left out
	matching = 0
)

// Compile compiles RFC 6901 JSON pointers, such as /sent_at or
// /meta/trace_id (~1 stands for / and ~0 for ~ within a token), with one
// extension: the token * matches every element of an array and every member
// of an object, so /items/*/client_ts leaves out client_ts in each element
// of items. A member named * cannot be singled out. A token of digits
// matches that index of an array, and a member of that name. The pointer ""
// (the whole document) is refused: a document with nothing left would be
// one fingerprint for every body.
func Compile(pointers []string) (*Ignore, error) {
	return compile(pointers, false)
}

// CompileOnly compiles pointers, with * as in Compile, into the complement:
// the canonical form keeps the values they match and the objects and
// arrays on the way to them, and leaves out everything else. An array
// keeps its length: an element left out becomes a null, so that an index
// still names its element. It is what Parse takes to read a few values of
// a large document without canonicalising the rest.
func CompileOnly(pointers []string) (*Ignore, error) {
	return compile(pointers, true)
}

func compile(pointers []string, only bool) (*Ignore, error) {
	ign := &Ignore{only: only}
	for _, ptr := range pointers {
		tokens, err := ParsePointer(ptr)
		if err != nil {
			return nil, fmt.Errorf("fingerprint_ignore: %w", err)
		}
		ign.pointers = append(ign.pointers, tokens)
	}
	return ign, nil
}

// ParsePointer splits an RFC 6901 pointer into its unescaped tokens.
func ParsePointer(ptr string) ([]string, error) {
	bad := func(why string) error {
		return fmt.Errorf("'%s' is not a JSON pointer (RFC 6901): %s", ptr, why)
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, bad("must start with /")
	}
	if !utf8.ValidString(ptr) {
		return nil, bad("not valid UTF-8")
	}
	// ~0 and ~1 never overlap, so the counts agree only if every ~ begins one.
	if strings.Count(ptr, "~") != strings.Count(ptr, "~0")+strings.Count(ptr, "~1") {
		return nil, bad("~ must be followed by 0 or 1")
	}
	tokens := strings.Split(ptr[1:], "/")
	for i, t := range tokens {
		tokens[i] = unescape.Replace(t)
	}
	return tokens, nil
}

// unescape turns a pointer's token into the member name in one pass, so
// that ~01 is ~1 and not /.
var unescape = strings.NewReplacer("~1", "/", "~0", "~")

// step is one member (its decoded key) or array element (its index, and
// no key) on the path from the root to a value.
type step struct {
	key   []byte
	index int // -1 for a member
}

// start is the state at the root of the document.
func (ign *Ignore) start() int32 {
	if ign == nil || len(ign.pointers) == 0 {
		return kept
	}
	return matching
}

// at returns the state of the value at path, whose parent was matching,
// and whether the value is left out.
func (ign *Ignore) at(path []step) (st int32, drop bool) {
	prefix, end := false, false
	for _, ptr := range ign.pointers {
		if len(ptr) >= len(path) && leadsTo(ptr, path) {
			prefix = true
			end = end || len(ptr) == len(path)
		}
	}
	switch {
	case ign.only && !prefix:
		return dropped, true
	case ign.only && end:
		return kept, false
	case end:
		return dropped, true
	case !prefix:
		return kept, false
	}
	return matching, false
}

// leadsTo reports whether the first tokens of ptr match path.
func leadsTo(ptr []string, path []step) bool {
	for i, s := range path {
		switch tok := ptr[i]; {
		case tok == "*":
		case s.index < 0 && string(s.key) != tok:
			return false
		case s.index >= 0 && arrayIndex(tok) != s.index:
			return false
		}
	}
	return true
}

// holes says whether an array element left out leaves a null in its
// place, under an array read in state st.
func (ign *Ignore) holes(st int32) bool { return ign != nil && ign.only && st != dropped }
