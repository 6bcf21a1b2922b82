package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// blockedBy waits until n statements wait for a lock that tx holds.
func blockedBy(t testing.TB, tx pgx.Tx, n int) {
	t.Helper()
	ctx := context.Background()
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "statements to wait for the test's lock", func() bool {
		// pg_stat_activity keeps what a transaction saw first, unless cleared.
		var waiting int
		if _, err := tx.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid).
			Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	})
}

// beginOn is begin on the server of dsn.
func beginOn(t testing.TB, dsn string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("beginning: %v", err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	return tx
}

// lockRow takes key's row lock in a transaction of the test's.
func lockRow(t testing.TB, s *Store, k store.Key) pgx.Tx {
	t.Helper()
	tx := beginOn(t, s.dsn)
	if _, err := tx.Exec(context.Background(), "SELECT 1 FROM "+s.db.qualified+" WHERE key = $1 FOR UPDATE", k[:]); err != nil {
		t.Fatal(err)
	}
	return tx
}

// holdWires keeps every wire of s busy, one per pool connection: a
// renewal on each, sent alone, waits for the row lock of a transaction of
// the test's. release rolls them back and waits for the renewals, which
// must succeed.
func holdWires(t testing.TB, s *Store) (release func()) {
	t.Helper()
	var txs []pgx.Tx
	renewed := make(chan error, s.db.batch.wires)
	for range s.db.batch.wires {
		k, c := storetest.NewKey(), claim(time.Minute)
		mustAcquire(t, s, k, c)
		tx := lockRow(t, s, k)
		go func() { renewed <- s.Renew(context.Background(), k, c.Token, time.Minute) }()
		blockedBy(t, tx, 1)
		txs = append(txs, tx)
	}
	return func() {
		t.Helper()
		for _, tx := range txs {
			if err := tx.Rollback(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for range txs {
			if err := <-renewed; err != nil {
				t.Fatalf("a renewal that held a wire: %v", err)
			}
		}
	}
}

// queued waits until n calls wait in s's queue.
func queued(t testing.TB, s *Store, n int) {
	t.Helper()
	waitFor(t, "calls to queue", func() bool {
		s.db.batch.mu.Lock()
		defer s.db.batch.mu.Unlock()
		return len(s.db.batch.queue) >= n
	})
}

// run calls f for each of n, concurrently, and returns their errors once
// all are done.
func run(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errs
}

// transactions is how many transactions wrote the rows of keys.
func transactions(t testing.TB, s *Store, keys []store.Key) int {
	t.Helper()
	raw := make([][]byte, len(keys))
	for i := range keys {
		raw[i] = keys[i][:]
	}
	var n int
	if err := begin(t).QueryRow(context.Background(), "SELECT count(DISTINCT xmin::text) FROM "+s.db.qualified+" WHERE key = ANY($1)", raw).
		Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func newKeys(n int) []store.Key {
	keys := make([]store.Key, n)
	for i := range keys {
		keys[i] = storetest.NewKey()
	}
	return keys
}

// Claims made while another statement is on the wire wait for it, then
// go together: one round trip and one transaction, so one commit, for
// all; and a claim and a completion of other keys with them.
func TestQueuedCallsGoAsOneTransaction(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	done, c := storetest.NewKey(), claim(time.Minute)
	mustAcquire(t, s, done, c)
	release := holdWires(t, s)
	keys := newKeys(8)
	results := make(chan []error, 1)
	go func() {
		results <- run(len(keys)+1, func(i int) error {
			if i == len(keys) {
				return s.Complete(context.Background(), done, c, &store.Response{Status: 201}, time.Minute)
			}
			got, err := s.Acquire(context.Background(), keys[i], claim(time.Minute))
			if err == nil && got.Record != nil {
				return errors.New("the new key had a record")
			}
			return err
		})
	}()
	queued(t, s, len(keys)+1)
	select {
	case <-results:
		t.Fatal("queued calls were answered while the wire was busy")
	default:
	}
	release()
	for i, err := range <-results {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if n := transactions(t, s, append(keys, done)); n != 1 {
		t.Fatalf("the queued claims and completion were written by %d transactions, want 1", n)
	}
}

// A batch takes its rows in key order, whatever the order its calls came
// in, so that two batches never wait for each other's rows in a cycle: in
// a fresh table, the claims' rows lie in the heap in the order they were
// inserted.
func TestBatchTakesRowsInKeyOrder(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	release := holdWires(t, s)
	keys := newKeys(8)
	slices.SortFunc(keys, func(a, b store.Key) int { return bytes.Compare(b[:], a[:]) }) // descending
	results := make(chan []error, 1)
	go func() {
		results <- run(len(keys), func(i int) error {
			time.Sleep(time.Duration(i) * 5 * time.Millisecond) // in the queue in this order, most likely
			_, err := s.Acquire(context.Background(), keys[i], claim(time.Minute))
			return err
		})
	}()
	queued(t, s, len(keys))
	release()
	for _, err := range <-results {
		if err != nil {
			t.Fatal(err)
		}
	}
	raw := make([][]byte, len(keys))
	for i := range keys {
		raw[i] = keys[i][:]
	}
	rows, _ := begin(t).Query(context.Background(), "SELECT key FROM "+s.db.qualified+" WHERE key = ANY($1) ORDER BY ctid", raw)
	batch, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(batch, bytes.Compare) {
		t.Fatalf("the batch inserted its claims in the order %x, not by key", batch)
	}
}

// A queued call whose caller leaves is withdrawn: it answers at once, and
// its claim is never made.
func TestQueuedCallWithdrawn(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	release := holdWires(t, s)
	k := storetest.NewKey()
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, k, claim(time.Minute))
		answered <- err
	}()
	queued(t, s, 1)
	cancel()
	if err := <-answered; !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a withdrawn claim = %v, want ErrUnavailable for the cancelled context", err)
	}
	release()
	if rec, _, err := s.Lookup(context.Background(), k); rec != nil || err != nil {
		t.Fatalf("the withdrawn claim's key holds %+v, %v; want nothing", rec, err)
	}
}

// A statement that fails in a batch fails its own call alone: the batch
// rolls back, the statement runs again alone, and the others again
// together, their claims and completions made.
func TestFailedStatementFailsOnlyItsCall(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	done, c := storetest.NewKey(), claim(time.Minute)
	mustAcquire(t, s, done, c)
	release := holdWires(t, s)
	keys := newKeys(6)
	bad := 2 // its creation time is before any PostgreSQL can store
	results := make(chan []error, 1)
	go func() {
		results <- run(len(keys)+1, func(i int) error {
			if i == len(keys) {
				return s.Complete(context.Background(), done, c, &store.Response{Status: 201}, time.Minute)
			}
			cl := claim(time.Minute)
			if i == bad {
				cl.CreatedAt = time.Date(-200000, 1, 1, 0, 0, 0, 0, time.UTC)
			}
			_, err := s.Acquire(context.Background(), keys[i], cl)
			return err
		})
	}()
	queued(t, s, len(keys)+1)
	release()
	for i, err := range <-results {
		switch {
		case i == bad && !errors.Is(err, store.ErrUnavailable):
			t.Errorf("the claim that cannot be stored = %v, want ErrUnavailable", err)
		case i != bad && err != nil:
			t.Errorf("call %d failed with the one beside it: %v", i, err)
		}
	}
	for i, k := range keys {
		rec, _, err := s.Lookup(context.Background(), k)
		if err != nil || (rec == nil) != (i == bad) {
			t.Errorf("key %d holds %+v, %v", i, rec, err)
		}
	}
	if rec, _, err := s.Lookup(context.Background(), done); err != nil || rec == nil || rec.State != store.Completed {
		t.Errorf("the completion batched with the failed claim left %+v, %v", rec, err)
	}
}

// A batch whose connection is lost fails the calls it carried, as a store
// outage: they answer ErrUnavailable, and nothing of them is kept. The
// calls on the wires before it, and the calls after, are not touched.
func TestLostBatchFailsOnlyItsCalls(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	stuck, c := storetest.NewKey(), claim(time.Minute)
	mustAcquire(t, s, stuck, c)
	// The batch, queued behind the held wires, stops at a row the test holds.
	tx := lockRow(t, s, stuck)
	release := holdWires(t, s)
	keys := newKeys(maxBatchCalls - 1)
	results := make(chan []error, 1)
	go func() {
		results <- run(maxBatchCalls, func(i int) error {
			if i == len(keys) {
				return s.Renew(ctx, stuck, c.Token, time.Minute)
			}
			_, err := s.Acquire(ctx, keys[i], claim(time.Minute))
			return err
		})
	}()
	queued(t, s, maxBatchCalls)
	release()
	blockedBy(t, tx, 1)
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	for i, err := range <-results {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("call %d of the lost batch = %v, want ErrUnavailable", i, err)
		}
	}
	for i, k := range keys {
		if rec, _, err := s.Lookup(ctx, k); rec != nil || err != nil {
			t.Errorf("key %d of the lost batch holds %+v, %v; want nothing", i, rec, err)
		}
	}
	if _, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute)); err != nil {
		t.Fatalf("a claim after the lost batch: %v", err)
	}
}

// A batch of replays writes nothing, so it commits nothing to wait for: no
// transaction ID, as a replay alone; a batch of claims takes one for all.
// A server of its own, without autovacuum, whose work would take IDs too.
func TestBatchTransactionIDs(t *testing.T) {
	srv := testpg.Start(t)
	sqlExec(t, srv.DSN(), "ALTER SYSTEM SET autovacuum = off")
	sqlExec(t, srv.DSN(), "SELECT pg_reload_conf()")
	s := storetest.Provision(t, &Store{DSN: srv.DSN(), Table: newTable()})
	ctx := context.Background()
	stored := newKeys(8)
	for _, k := range stored {
		c := claim(time.Minute)
		mustAcquire(t, s, k, c)
		if err := s.Complete(ctx, k, c, &store.Response{Status: 201, Body: []byte("stored")}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	xid := func() int64 {
		var x int64
		if err := conn.QueryRow(ctx, "SELECT txid_current()").Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	for _, tc := range []struct {
		name string
		keys []store.Key
		want int64 // transaction IDs taken: the batch's, and the second txid_current's
	}{
		{"replays", stored, 1},
		{"claims", newKeys(8), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The test's row lock took an ID, and so did the renewal
			// that waits for it, before it waits.
			release := holdWires(t, s)
			before := xid()
			results := make(chan []error, 1)
			go func() {
				results <- run(len(tc.keys), func(i int) error {
					_, err := s.Acquire(ctx, tc.keys[i], claim(time.Minute))
					return err
				})
			}()
			queued(t, s, len(tc.keys))
			release()
			for _, err := range <-results {
				if err != nil {
					t.Fatal(err)
				}
			}
			if took := xid() - before; took != tc.want {
				t.Fatalf("%d transaction IDs taken, want %d", took, tc.want)
			}
		})
	}
}

// BenchmarkPipelining measures a new key's claim and completion from conc
// goroutines at once, with pipelining and without, on loopback and over a
// link that adds latency each way, as to a database in another zone: ns/op
// is the time per new key of the whole (its inverse the throughput), p50
// and p99 each new key's own. The shared server runs without fsync, so
// that the round trips, not the disk, are what it measures.
//
//	go test -run '^$' -bench Pipelining -benchtime 2000x ./store/postgres/
func BenchmarkPipelining(b *testing.B) {
	for _, latency := range []time.Duration{0, time.Millisecond} {
		proxy := faultproxy.Start(b, shared.Addr())
		proxy.SetLatency(latency)
		dsn := "postgres://postgres@" + proxy.Addr() + "/postgres?sslmode=disable"
		for _, pipelining := range []bool{false, true} {
			s := storetest.Provision(b, &Store{DSN: dsn, Table: newTable(), Pipelining: &pipelining})
			for _, conc := range []int{1, 4, 8, 16, 64} {
				b.Run(fmt.Sprintf("latency=%v/pipelining=%t/c=%d", latency, pipelining, conc), func(b *testing.B) {
					benchmarkNewKeys(b, s, conc)
				})
			}
		}
	}
}

func benchmarkNewKeys(b *testing.B, s *Store, conc int) {
	ctx := context.Background()
	resp := &store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: make([]byte, 64)}
	var next atomic.Int64
	took := make([][]time.Duration, conc)
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				k, c := storetest.NewKey(), claim(time.Minute)
				if got, err := s.Acquire(ctx, k, c); err != nil || got.Record != nil {
					b.Errorf("Acquire = %+v, %v", got, err)
					return
				}
				if err := s.Complete(ctx, k, c, resp, time.Hour); err != nil {
					b.Errorf("Complete: %v", err)
					return
				}
				took[g] = append(took[g], time.Since(start))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(took...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	}
}
