package postgres

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestContract(t *testing.T) {
	open := func(t *testing.T) store.Store {
		return storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	}
	storetest.Run(t, open)
	storetest.RunTakeover(t, open)
}

// Caddy must start while PostgreSQL is down, every call must fail fast with
// ErrUnavailable while it is, and the same store must work again, creating
// its table, once PostgreSQL is back; and again after a crash.
func TestUnavailableThenRecovers(t *testing.T) {
	srv := testpg.Start(t)
	srv.Kill()
	s := storetest.Provision(t, &Store{DSN: srv.DSN(), Table: newTable()})
	storetest.CheckUnavailable(t, s)

	srv.Restart(t)
	ctx := context.Background()
	if rec, err := recordOf(s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))); rec != nil || err != nil {
		t.Fatalf("Acquire once PostgreSQL is up = %+v, %v; want a claim", rec, err)
	}

	srv.Kill()
	start := time.Now()
	storetest.CheckUnavailable(t, s)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("four calls on a dead PostgreSQL took %v", took)
	}

	srv.Restart(t)
	k, c := storetest.NewKey(), claim(time.Minute)
	if rec, err := recordOf(s.Acquire(ctx, k, c)); rec != nil || err != nil {
		t.Fatalf("Acquire after the restart = %+v, %v; want a claim", rec, err)
	}
	if err := s.Complete(ctx, k, c, &store.Response{Status: 204}, time.Minute); err != nil {
		t.Fatalf("Complete after the restart: %v", err)
	}
}

func TestDeadlineIsRespected(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	k := storetest.NewKey()
	// Hold the key's row lock so that a takeover has to wait for it.
	if _, err := s.Acquire(context.Background(), k, claim(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	ctx := context.Background()
	tx := begin(t)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s.db.qualified+" WHERE key = $1 FOR UPDATE", k[:]); err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(short, k, claim(time.Minute))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire past its deadline = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Acquire took %v with a 200ms deadline", took)
	}
}

func BenchmarkAcquireNewKey(b *testing.B) {
	s := storetest.Provision(b, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	c := claim(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if rec, err := recordOf(s.Acquire(ctx, storetest.NewKey(), c)); rec != nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", rec, err)
		}
	}
}

// A new key's whole path through the store: the claim, then the response.
func BenchmarkAcquireComplete(b *testing.B) {
	s := storetest.Provision(b, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	c := claim(time.Minute)
	resp := &store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body: make([]byte, 64)}
	b.ReportAllocs()
	for b.Loop() {
		k := storetest.NewKey()
		if rec, err := recordOf(s.Acquire(ctx, k, c)); rec != nil || err != nil {
			b.Fatalf("Acquire = %+v, %v", rec, err)
		}
		if err := s.Complete(ctx, k, c, resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := storetest.Provision(b, &Store{DSN: shared.DSN(), Table: newTable()})
	storetest.BenchmarkReplay(b, s, storetest.JSONResponse())
}

// With a connection per goroutine, the losers' statements start before the
// winner's commits and see no row in their snapshot: they must run again
// and find the claim, never report an error or a second win.
func TestClaimRaceManyConnections(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable(), MaxConns: 32})
	for range 20 {
		k := storetest.NewKey()
		var wg sync.WaitGroup
		var winners atomic.Int32
		start := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				<-start
				rec, err := recordOf(s.Acquire(context.Background(), k, claim(time.Minute)))
				switch {
				case err != nil:
					t.Errorf("Acquire: %v", err)
				case rec == nil:
					winners.Add(1)
				case rec.State != store.InProgress:
					t.Errorf("loser saw %+v", rec)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := winners.Load(); n != 1 {
			t.Fatalf("%d winners, want 1", n)
		}
	}
}

// Many requests find the same expired claim at once: exactly one takes it
// over, and the others find its claim.
func TestTakeoverRaceManyConnections(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable(), MaxConns: 32})
	ctx := context.Background()
	for range 20 {
		k := storetest.NewKey()
		if _, err := s.Acquire(ctx, k, claim(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		var wg sync.WaitGroup
		var winners, tookOver atomic.Int32
		start := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				<-start
				c := claim(time.Minute)
				got, err := s.Acquire(ctx, k, c)
				rec := got.Record
				switch {
				case err != nil:
					t.Errorf("Acquire: %v", err)
				case rec == nil:
					winners.Add(1)
					if got.TookOver {
						tookOver.Add(1)
					}
				case rec.State != store.InProgress:
					t.Errorf("loser saw %+v", rec)
				}
			})
		}
		close(start)
		wg.Wait()
		if w, o := winners.Load(), tookOver.Load(); w != 1 || o != 1 {
			t.Fatalf("%d winners, %d of them taking over; want 1 and 1", w, o)
		}
	}
}

// A claim that commits while Acquire's statement waits on it is invisible to
// that statement's snapshot: Acquire must run again and return it.
func TestAcquireRacingAnUncommittedClaim(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	if err := s.db.ensure(ctx); err != nil {
		t.Fatal(err)
	}
	tx := begin(t)
	k, other := storetest.NewKey(), storetest.NewToken()
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.db.qualified+` (key, state, token, endpoint, fingerprint, expires_at)
		VALUES ($1, 'in_progress', $2, 'POST /other', $3, now() + interval '1 minute')`, k[:], other[:], make([]byte, 32)); err != nil {
		t.Fatal(err)
	}

	type result struct {
		rec *store.Record
		err error
	}
	done := make(chan result)
	go func() {
		rec, err := recordOf(s.Acquire(ctx, k, claim(time.Minute)))
		done <- result{rec, err}
	}()
	// Wait until Acquire blocks on the uncommitted row, then commit it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var waiting int
		if err := tx.Conn().QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Acquire never waited on the uncommitted claim")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.rec == nil || r.rec.Token != other || r.rec.Endpoint != "POST /other" {
		t.Fatalf("Acquire racing a committed claim = %+v, %v; want that claim", r.rec, r.err)
	}
}
