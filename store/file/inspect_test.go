package file

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestInspector(t *testing.T) {
	storetest.RunInspector(t, func(t *testing.T) store.Store { return storetest.Provision(t, &Store{Path: t.TempDir()}) })
}

func TestInspectorUnavailableOnceClosed(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	s.Cleanup()
	storetest.CheckInspectorUnavailable(t, s)
}

// One file is one name however its path is spelled, registered until the
// last store that uses it is cleaned up.
func TestRegistered(t *testing.T) {
	dir := t.TempDir()
	a := storetest.Provision(t, &Store{Path: dir})
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	name := "file " + real
	if got := storetest.Registered(name); got != a {
		t.Fatalf("registered %v under %s, want the store", got, name)
	}
	b := storetest.Provision(t, &Store{Path: dir + "/./"})
	a.Cleanup()
	if got := storetest.Registered(name); got != b {
		t.Fatalf("registered %v after the old config's cleanup, want the new store", got)
	}
	b.Cleanup()
	if got := storetest.Registered(name); got != nil {
		t.Fatalf("registered %v after every cleanup, want none", got)
	}

	// A given name replaces the default one.
	named := storetest.Provision(t, &Store{Name: "orders", Path: dir})
	if got := storetest.Registered("orders"); got != named {
		t.Fatalf("registered %v under orders, want the named store", got)
	}
}

// InFlight lists the claims in memory, whatever the length of their
// endpoint, and nothing from the file: neither completed records nor
// values this store did not write, such as one with an in-progress state
// byte but no magic.
func TestInFlightListsOnlyClaims(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	k := storetest.NewKey()
	c := claim(time.Minute)
	c.Endpoint = "POST example.com/" + strings.Repeat("x", 5000)
	if got, err := s.Acquire(ctx, k, c); got.Record != nil || err != nil {
		t.Fatal(got.Record, err)
	}
	done, dc := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, done, dc); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, dc, &store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	err := s.db().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		bad := bytes.Repeat([]byte{0xff}, 100)
		bad[0] = 0x7f
		bad[1] = byte(store.InProgress) // where the codec keeps the state
		for key, v := range map[string][]byte{"short-key": bad, strings.Repeat("k", 32): []byte("x"), strings.Repeat("j", 32): bad} {
			if err := b.Put([]byte(key), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.InFlight(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != k || got[0].Endpoint != c.Endpoint {
		t.Fatalf("InFlight = %+v, want the one claim", got)
	}
}
