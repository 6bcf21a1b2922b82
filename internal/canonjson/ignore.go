package canonjson

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Ignore is a compiled set of JSON pointers whose members and array
// elements the canonical form leaves out, as if they were absent. A nil
// *Ignore leaves nothing out. It is safe for concurrent use.
//
// The pointers are compiled into a deterministic automaton over the path
// from the root, so that reading a member costs one map lookup on its
// decoded key, and nothing at all below a path that no pointer can reach.
type Ignore struct {
	states []state
	// only inverts the pointers: they name what is kept, and everything
	// off their paths is left out (CompileOnly).
	only bool
}

// dropped is the state under a value that is left out: everything below it
// is left out too, each member and element as soon as it is read, so that
// a large value left out never fills the scratch space.
const dropped = -2

// state is one node of the automaton: the set of pointer prefixes that the
// path read so far can still match.
type state struct {
	tokens map[string]int32 // the next state after a member or element with this token
	other  int32            // the next state after any other token; -1 when none
	drop   bool             // a pointer ends here: the value is left out
}

// maxStates bounds the automaton: many wildcard pointers overlapping each
// other could otherwise make it grow exponentially.
const maxStates = 1 << 14

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
	nodes := []trieNode{{}} // the root
	for _, ptr := range pointers {
		tokens, err := ParsePointer(ptr)
		if err != nil {
			return nil, fmt.Errorf("fingerprint_ignore: %w", err)
		}
		n := 0
		for _, t := range tokens {
			c, ok := nodes[n].tokens[t]
			if !ok {
				c = len(nodes)
				if nodes[n].tokens == nil {
					nodes[n].tokens = make(map[string]int)
				}
				nodes[n].tokens[t] = c
				nodes = append(nodes, trieNode{})
			}
			n = c
		}
		nodes[n].end = true
	}
	ign, err := build(nodes)
	if ign != nil {
		ign.only = only
	}
	return ign, err
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

// trieNode is one token of one or more pointers: its children, by token
// (* being the wildcard), are indices into the trie's nodes.
type trieNode struct {
	tokens map[string]int
	end    bool
}

// build turns the trie into an automaton whose states are sets of trie
// nodes: a path can match a literal token and a * at once.
func build(nodes []trieNode) (*Ignore, error) {
	ign := new(Ignore)
	if len(nodes) == 1 {
		return ign, nil
	}
	ids := make(map[string]int32)
	var sets [][]int
	add := func(set []int) (int32, error) {
		if len(set) == 0 {
			return -1, nil
		}
		slices.Sort(set)
		set = slices.Compact(set)
		key := fmt.Sprint(set)
		if id, ok := ids[key]; ok {
			return id, nil
		}
		if len(sets) == maxStates {
			return 0, fmt.Errorf("fingerprint_ignore: the pointers overlap too much (more than %d combinations)", maxStates)
		}
		id := int32(len(sets))
		ids[key] = id
		sets = append(sets, set)
		ign.states = append(ign.states, state{other: -1})
		return id, nil
	}
	if _, err := add([]int{0}); err != nil {
		return nil, err
	}
	for i := 0; i < len(sets); i++ {
		set := sets[i]
		var stars []int
		for _, n := range set {
			ign.states[i].drop = ign.states[i].drop || nodes[n].end
			if star, ok := nodes[n].tokens["*"]; ok {
				stars = append(stars, star)
			}
		}
		if ign.states[i].drop {
			continue // nothing under a dropped value is read
		}
		tokens := make(map[string]int32)
		for _, n := range set {
			for t := range nodes[n].tokens {
				if _, done := tokens[t]; done || t == "*" {
					continue
				}
				next := slices.Clone(stars)
				for _, m := range set {
					if c, ok := nodes[m].tokens[t]; ok {
						next = append(next, c)
					}
				}
				id, err := add(next)
				if err != nil {
					return nil, err
				}
				tokens[t] = id
			}
		}
		other, err := add(stars)
		if err != nil {
			return nil, err
		}
		ign.states[i].tokens = tokens
		ign.states[i].other = other
	}
	return ign, nil
}

// start is the state at the root of the document, -1 when nothing can be
// left out.
func (ign *Ignore) start() int32 {
	if ign == nil || len(ign.states) == 0 {
		return -1
	}
	return 0
}

// member returns the state under the member named key of an object read in
// state st, and whether the member is left out.
func (ign *Ignore) member(st int32, key []byte) (next int32, drop bool) {
	if st < 0 {
		return st, st == dropped
	}
	s := &ign.states[st]
	next, ok := s.tokens[string(key)]
	if !ok {
		next = s.other
	}
	return ign.follow(next)
}

// element is member for the element at index i of an array.
func (ign *Ignore) element(st int32, i int) (next int32, drop bool) {
	if st < 0 {
		return st, st == dropped
	}
	s := &ign.states[st]
	next = s.other
	if len(s.tokens) > 0 {
		var digits [20]byte
		if n, ok := s.tokens[string(strconv.AppendInt(digits[:0], int64(i), 10))]; ok {
			next = n
		}
	}
	return ign.follow(next)
}

// follow interprets the state a member or element leads to. -1 keeps
// everything below; a state whose pointer ends there is left out, or with
// only, kept whole, and a state no pointer reaches is left out with only.
func (ign *Ignore) follow(next int32) (int32, bool) {
	end := next >= 0 && ign.states[next].drop
	switch {
	case ign.only && next < 0:
		return dropped, true
	case ign.only && end:
		return -1, false
	case end:
		return dropped, true
	}
	return next, false
}

// holes says whether an array element left out leaves a null in its
// place, under an array read in state st.
func (ign *Ignore) holes(st int32) bool { return ign != nil && ign.only && st != dropped }
