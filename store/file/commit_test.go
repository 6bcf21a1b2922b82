package file

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func openBolt(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "g.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(records); return err }); err != nil {
		t.Fatal(err)
	}
	return db
}

// Concurrent writers share transactions (so syncs), each write lands, and a
// writer's failure is its own: the others in its transaction commit.
func TestGroupCommitSharesTransactionsAndIsolatesErrors(t *testing.T) {
	db := openBolt(t)
	g := &groupCommit{db: db}
	const writers = 64
	errRefused := errors.New("refused")
	var (
		mu  sync.Mutex
		txs = map[int]int{} // transaction ID -> writers in it
		wg  sync.WaitGroup
	)
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.update(func(tx *bolt.Tx) error {
				mu.Lock()
				txs[tx.ID()]++
				mu.Unlock()
				if i%8 == 0 {
					return errRefused // before writing, as the owner checks do
				}
				return tx.Bucket(records).Put([]byte(fmt.Sprint(i)), []byte("v"))
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if want := error(nil); i%8 == 0 {
			if !errors.Is(err, errRefused) {
				t.Errorf("writer %d: %v, want its own error", i, err)
			}
		} else if err != want {
			t.Errorf("writer %d: %v", i, err)
		}
	}
	db.View(func(tx *bolt.Tx) error {
		for i := range writers {
			if got := tx.Bucket(records).Get([]byte(fmt.Sprint(i))); (got != nil) == (i%8 == 0) {
				t.Errorf("key %d: %q after the commits", i, got)
			}
		}
		return nil
	})
	if len(txs) >= writers {
		t.Errorf("%d writers used %d transactions: none was shared", writers, len(txs))
	}
	t.Logf("%d writers committed in %d transactions", writers, len(txs))
	if g.running || len(g.queue) != 0 {
		t.Errorf("after the writers: running %t, %d queued", g.running, len(g.queue))
	}
}

// A write that panics fails its transaction, not the store: the writers
// that shared it get an error, nothing of theirs was written, and the next
// writes commit as usual.
func TestGroupCommitSurvivesAPanickingWrite(t *testing.T) {
	db := openBolt(t)
	g := &groupCommit{db: db}
	put := func(k string) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error { return tx.Bucket(records).Put([]byte(k), []byte("v")) }
	}
	// One transaction, built by hand as the leader would: a, a panic, b.
	batch := []*pendingWrite{
		{fn: put("a"), done: make(chan struct{}, 1)},
		{fn: func(*bolt.Tx) error { panic("boom") }, done: make(chan struct{}, 1)},
		{fn: put("b"), done: make(chan struct{}, 1)},
	}
	g.commit(batch)
	for i, w := range batch {
		select {
		case <-w.done:
		default:
			t.Fatalf("write %d was never answered", i)
		}
		if w.err == nil {
			t.Errorf("write %d succeeded in a transaction that panicked", i)
		}
	}
	if err := g.update(put("c")); err != nil {
		t.Fatalf("the next write: %v", err)
	}
	db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		if b.Get([]byte("a")) != nil || b.Get([]byte("b")) != nil || b.Get([]byte("c")) == nil {
			t.Error("the panicking transaction left writes behind, or the next one did not commit")
		}
		return nil
	})
}

// A panic inside bbolt's commit, after every write ran (here a commit
// handler's, which bbolt runs within Commit), fails the transaction too
// (issue 35): its writer gets an error, not the panic, and the group
// commit is handed on, so that the next write commits rather than wait
// forever for a leader.
func TestGroupCommitSurvivesAPanicInTheCommit(t *testing.T) {
	g := &groupCommit{db: openBolt(t)}
	errc := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				errc <- fmt.Errorf("the panic escaped the group commit: %v", p)
			}
		}()
		errc <- g.update(func(tx *bolt.Tx) error {
			tx.OnCommit(func() { panic("boom") })
			return tx.Bucket(records).Put([]byte("a"), []byte("v"))
		})
	}()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "panicked: boom") {
		t.Errorf("the write whose commit panicked = %v, want an error that says so", err)
	}
	next := make(chan error, 1)
	go func() {
		next <- g.update(func(tx *bolt.Tx) error { return tx.Bucket(records).Put([]byte("b"), []byte("v")) })
	}()
	select {
	case err := <-next:
		if err != nil {
			t.Fatalf("the next write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next write did not return within 10s: the panic left the group commit held")
	}
}

// Writes to one key in one shared transaction apply in order, as serial
// transactions would: each sees the writes queued before it.
func TestGroupCommitWritesApplyInOrder(t *testing.T) {
	g := &groupCommit{db: openBolt(t)}
	const writers = 32
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			err := g.update(func(tx *bolt.Tx) error {
				b := tx.Bucket(records)
				n := 0
				if v := b.Get([]byte("n")); v != nil {
					n = int(binary.BigEndian.Uint64(v))
				}
				return b.Put([]byte("n"), binary.BigEndian.AppendUint64(nil, uint64(n+1)))
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	g.db.View(func(tx *bolt.Tx) error {
		if n := binary.BigEndian.Uint64(tx.Bucket(records).Get([]byte("n"))); n != writers {
			t.Errorf("%d increments of one key left %d", writers, n)
		}
		return nil
	})
}

// Claims and completions from many goroutines: the throughput group commit
// is for (one fsync per transaction, shared by the writers waiting on it).
func BenchmarkParallelNewKeys(b *testing.B) {
	s := storetest.Provision(b, &Store{Path: b.TempDir()})
	resp := &store.Response{Status: 201, Body: []byte(`{"ok":true}`)}
	b.SetParallelism(8) // 16 goroutines on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Endpoint: "POST h/p", CreatedAt: time.Now(), Lease: time.Minute}
			if got, err := s.Acquire(ctx, k, c); got.Record != nil || err != nil {
				b.Fatalf("Acquire = %v, %v", got.Record, err)
			}
			if err := s.Complete(ctx, k, c, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}
