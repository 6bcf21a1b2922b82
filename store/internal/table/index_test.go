package table

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// The index against a Go map, through inserts, lookups, removals from
// anywhere in probe chains, evictions, growth and a Clear. A third of the
// keys share their first 16 bytes, hence their hash, so they pile up in
// one long chain whose middle removals must shift the rest back.
func TestIndexAgreesWithAMapUnderChurn(t *testing.T) {
	tab := newTable(t, 3000, 1<<30)
	tab.Lock()
	defer tab.Unlock()
	rng := rand.New(rand.NewPCG(1, 2))
	newKey := func() store.Key {
		k := storetest.NewKey()
		if rng.IntN(3) == 0 {
			clear(k[:16])
		}
		return k
	}
	model := map[store.Key]store.Encoded{}
	var keys []store.Key
	later := time.Now().Add(time.Hour).UnixNano()
	for step := range 20_000 {
		switch op := rng.IntN(10); {
		case op < 5 || len(keys) == 0: // insert
			k := newKey()
			blob := completedBlob(rng.IntN(50))
			if op == 0 {
				blob = claimBlob()
			}
			if err := tab.MakeRoom(Size(blob)); err != nil {
				continue
			}
			tab.Insert(k, blob, later)
			model[k] = blob
			keys = append(keys, k)
		case op < 8: // remove one, wherever it stands
			i := rng.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			if e := tab.Lookup(k); e != nil {
				tab.Remove(e)
			}
			delete(model, k)
		default: // look one up
			k := keys[rng.IntN(len(keys))]
			e := tab.Lookup(k)
			if want, ok := model[k]; ok != (e != nil) || ok && &e.Blob[0] != &want[0] {
				t.Fatalf("step %d: lookup disagrees with the map", step)
			}
		}
		// evictions drop keys the model still has
		for k := range model {
			if len(model) == tab.Len() {
				break
			}
			if tab.Lookup(k) == nil {
				delete(model, k)
			}
		}
		if step%997 == 0 {
			if err := tab.Check(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		if step == 15_000 {
			tab.Clear()
			clear(model)
			keys = keys[:0]
		}
	}
	if err := tab.Check(); err != nil {
		t.Fatal(err)
	}
	for k, want := range model {
		if e := tab.Lookup(k); e == nil || &e.Blob[0] != &want[0] {
			t.Fatal("the table lost a key the map holds")
		}
	}
	if tab.Len() != len(model) {
		t.Fatalf("the table holds %d entries, the map %d", tab.Len(), len(model))
	}
}
