package table

import (
	"encoding/binary"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The index is an open-addressing hash table of slot numbers, linear
// probing, at most half full. Each word packs a 32-bit hash of its key and
// its slot number plus one (0 is empty), so that probing reads a slot only
// on a likely hit and deletion reads none. The GC never scans it.
//
// Keys are SHA-256 digests, so the hash mixes their first 16 bytes; the
// multiply spreads keys that differ only there (as tests build them).
const minIndex = 1 << 10

func hash32(k *store.Key) uint32 {
	h := binary.LittleEndian.Uint64(k[0:8]) ^ binary.LittleEndian.Uint64(k[8:16])*0x9e3779b97f4a7c15
	return uint32((h * 0xbf58476d1ce4e5b9) >> 32)
}

func pack(h uint32, s int32) uint64 { return uint64(h)<<32 | uint64(s+1) }

func slotOf(w uint64) int32 { return int32(uint32(w)) - 1 }

func hashOf(w uint64) uint32 { return uint32(w >> 32) }

// home is where a key of hash h starts its probe in an index of len(idx).
func home(idx []uint64, h uint32) int {
	return int(uint64(h) * uint64(len(idx)) >> 32)
}

// find returns the index position of k: where it is (found) or the empty
// position where it would go.
func (t *Table) find(k *store.Key) (pos int, found bool) { return t.probe(k, hash32(k)) }

// probe is find for a key whose hash, h, the caller has at hand.
func (t *Table) probe(k *store.Key, h uint32) (pos int, found bool) {
	mask := len(t.index) - 1
	for pos = home(t.index, h); ; pos = (pos + 1) & mask {
		w := t.index[pos]
		if w == 0 {
			return pos, false
		}
		if hashOf(w) == h && t.at(slotOf(w)).Key == *k {
			return pos, true
		}
	}
}

// unindex empties position pos, shifting back the entries after it that
// would otherwise no longer be found from their home (Knuth's algorithm R).
func (t *Table) unindex(pos int) {
	idx := t.index
	mask := len(idx) - 1
	idx[pos] = 0
	for j := (pos + 1) & mask; idx[j] != 0; j = (j + 1) & mask {
		h := home(idx, hashOf(idx[j]))
		// the entry at j may move to pos unless its home lies cyclically
		// in (pos, j]
		if (pos < j && pos < h && h <= j) || (pos > j && (h > pos || h <= j)) {
			continue
		}
		idx[pos], idx[j] = idx[j], 0
		pos = j
	}
}

// grow doubles the index once it would be more than half full.
func (t *Table) grow() {
	if 2*(t.n+1) <= len(t.index) {
		return
	}
	old := t.index
	t.index = make([]uint64, 2*len(old))
	mask := len(t.index) - 1
	for _, w := range old {
		if w == 0 {
			continue
		}
		pos := home(t.index, hashOf(w))
		for t.index[pos] != 0 {
			pos = (pos + 1) & mask
		}
		t.index[pos] = w
	}
}
