package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// live waits until s's tier is in use: its listener is up. Its table
// exists by then, so that the statements a test counts are its own and not
// the creation's.
func live(t testing.TB, s *Store) *Store {
	t.Helper()
	if err := s.db.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the listener", s.db.events.listening)
	return s
}

func openCached(t testing.TB, dsn string, size int64) *Store {
	t.Helper()
	return live(t, storetest.Provision(t, &Store{DSN: dsn, Table: newTable(), LocalCache: size}))
}

// statements is how many statements s ran during f: each takes a
// connection from the pool (the listener's is not the pool's).
func statements(s *Store, f func()) int64 {
	before := s.db.pool.Stat().AcquireCount()
	f()
	return s.db.pool.Stat().AcquireCount() - before
}

func complete(t testing.TB, s *Store, k store.Key, body string, ttl time.Duration) *store.Claim {
	t.Helper()
	c := claim(time.Minute)
	if rec, err := recordOf(s.Acquire(context.Background(), k, c)); rec != nil || err != nil {
		t.Fatalf("Acquire = %+v, %v", rec, err)
	}
	resp := &store.Response{Status: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte(body)}
	if err := s.Complete(context.Background(), k, c, resp, ttl); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return c
}

func replay(t testing.TB, s *Store, k store.Key) *store.Record {
	t.Helper()
	rec, err := recordOf(s.Acquire(context.Background(), k, claim(time.Minute)))
	if err != nil || rec == nil || rec.State != store.Completed {
		t.Fatalf("replay Acquire = %+v, %v; want the completed record", rec, err)
	}
	return rec
}

func TestContractWithLocalCache(t *testing.T) {
	open := func(t *testing.T) store.Store { return openCached(t, shared.DSN(), 1<<20) }
	storetest.Run(t, open)
	storetest.RunTakeover(t, open)
	storetest.RunInspector(t, open)
}

// A first execution costs its two statements, a replay its one, with the
// tier as without; a record this instance completed, or read once, is then
// replayed without a statement: the same record, binding included.
func TestTierReplaysWithoutAStatement(t *testing.T) {
	a, b := instances(t, shared.DSN(), "", newTable(), 1<<20)
	live(t, a)
	live(t, b)

	k := storetest.NewKey()
	var c *store.Claim
	if n := statements(a, func() { c = complete(t, a, k, "made here", time.Minute) }); n != 2 {
		t.Fatalf("a first execution ran %d statements, want 2", n)
	}
	var rec *store.Record
	if n := statements(a, func() { rec = replay(t, a, k) }); n != 0 {
		t.Fatalf("a replay of a record completed here ran %d statements", n)
	}
	if string(rec.Body) != "made here" || rec.Token != c.Token || rec.Endpoint != c.Endpoint ||
		rec.Fingerprint != c.Fingerprint || !rec.CreatedAt.Equal(c.CreatedAt) || rec.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("the tier replayed %+v for the claim %+v", rec, c)
	}

	// Completed elsewhere: the first replay reads the row, the next does not.
	k2 := storetest.NewKey()
	complete(t, b, k2, "made there", time.Minute)
	var fromRow *store.Record
	if n := statements(a, func() { fromRow = replay(t, a, k2) }); n != 1 {
		t.Fatalf("the first replay of a record completed elsewhere ran %d statements, want 1", n)
	}
	if n := statements(a, func() { rec = replay(t, a, k2) }); n != 0 {
		t.Fatalf("the second replay ran %d statements", n)
	}
	if string(rec.Body) != "made there" || rec.Token != fromRow.Token || !rec.CreatedAt.Equal(fromRow.CreatedAt) ||
		!rec.ExpiresAt.Equal(fromRow.ExpiresAt) || rec.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("the tier replayed %+v for the row read as %+v", rec, fromRow)
	}
}

// Claims are never kept: each duplicate runs its statement, and sees the
// claim end.
func TestTierNeverKeepsAClaim(t *testing.T) {
	a, b := instances(t, shared.DSN(), "", newTable(), 1<<20)
	live(t, a)
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	b.Acquire(ctx, k, c)
	for i := range 2 {
		if n := statements(a, func() {
			if rec, err := recordOf(a.Acquire(ctx, k, claim(time.Minute))); err != nil || rec == nil || rec.State != store.InProgress {
				t.Fatalf("duplicate Acquire = %+v, %v", rec, err)
			}
		}); n != 1 {
			t.Fatalf("duplicate %d of a claim ran %d statements, want 1", i+1, n)
		}
	}
	if err := b.Complete(ctx, k, c, &store.Response{Status: 200, Body: []byte("done")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if rec := replay(t, a, k); string(rec.Body) != "done" {
		t.Fatalf("after the completion, replayed %q", rec.Body)
	}
}

// A purge on one instance evicts the record from the other's tier.
func TestPurgeEvictsFromEveryTier(t *testing.T) {
	a, b := instances(t, shared.DSN(), "", newTable(), 1<<20)
	live(t, a)
	live(t, b)
	k := storetest.NewKey()
	complete(t, a, k, "purged", time.Minute)
	replay(t, b, k) // now in b's tier
	if n := statements(b, func() { replay(t, b, k) }); n != 0 {
		t.Fatalf("b's second replay ran %d statements", n)
	}
	if found, err := a.Delete(context.Background(), k); err != nil || !found {
		t.Fatalf("Delete = %t, %v", found, err)
	}
	if a.tier.Get(k) != nil {
		t.Fatal("the purging instance's own tier kept the record")
	}
	waitFor(t, "b's tier to drop the purged record", func() bool { return b.tier.Get(k) == nil })
	if rec, err := recordOf(b.Acquire(context.Background(), k, claim(time.Minute))); rec != nil || err != nil {
		t.Fatalf("Acquire on b after the purge = %+v, %v; want a claim", rec, err)
	}

	// A row deleted behind the store's back: a purge of the key, which
	// finds nothing, still evicts it.
	k = storetest.NewKey()
	complete(t, a, k, "deleted by hand", time.Minute)
	replay(t, b, k)
	sqlExec(t, shared.DSN(), "DELETE FROM "+a.db.qualified+" WHERE key = $1", k[:])
	if found, err := a.Delete(context.Background(), k); err != nil || found {
		t.Fatalf("Delete of a key without a row = %t, %v", found, err)
	}
	waitFor(t, "b's tier to drop the record", func() bool { return b.tier.Get(k) == nil })
}

// A killed PostgreSQL drops the listener: the tier is emptied and unused
// until the listener is back, so that no purge missed meanwhile leaves a
// record behind.
func TestPostgresRestartFlushesTheTier(t *testing.T) {
	srv := testpg.Start(t)
	s := openCached(t, srv.DSN(), 1<<20)
	vec, _ := store.SubscriptionLosses(nil)
	losses := vec.WithLabelValues(s.name)
	before := testutil.ToFloat64(losses)
	k := storetest.NewKey()
	complete(t, s, k, "before the crash", time.Hour)
	replay(t, s, k)

	srv.Kill()
	waitFor(t, "the loss to be counted", func() bool { return testutil.ToFloat64(losses) == before+1 })
	if s.tier.Get(k) != nil {
		t.Fatal("the tier still serves while the listener is down")
	}
	if _, err := s.Acquire(context.Background(), k, claim(time.Minute)); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire while PostgreSQL is down = %v, want ErrUnavailable", err)
	}
	srv.Restart(t)
	live(t, s)
	waitFor(t, "the pool to connect again", func() bool {
		_, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))
		return err == nil
	})
	// The row survived the crash: read once, then from the tier again.
	if n := statements(s, func() { replay(t, s, k) }); n != 1 {
		t.Fatalf("the first replay after the restart ran %d statements, want 1", n)
	}
	if n := statements(s, func() { replay(t, s, k) }); n != 0 {
		t.Fatalf("the second replay after the restart ran %d statements", n)
	}
}

// Each record leaves the tier at its own expiry: the row's, from the
// database's clock, for one read from the table.
func TestTierHonoursTheExpiry(t *testing.T) {
	s := openCached(t, shared.DSN(), 1<<20)
	short, long, fromRow := storetest.NewKey(), storetest.NewKey(), storetest.NewKey()
	complete(t, s, short, "short", 300*time.Millisecond)
	complete(t, s, long, "long", time.Hour)
	c := claim(time.Minute)
	s.Acquire(context.Background(), fromRow, c)
	sqlExec(t, shared.DSN(), `UPDATE `+s.db.qualified+` SET state = 'completed', status = 200, expires_at = now() + interval '300 milliseconds'
		WHERE key = $1`, fromRow[:])
	replay(t, s, fromRow)
	for _, k := range []store.Key{short, fromRow} {
		if n := statements(s, func() { replay(t, s, k) }); n != 0 {
			t.Fatalf("a replay before the expiry ran %d statements", n)
		}
	}
	time.Sleep(400 * time.Millisecond)
	for _, k := range []store.Key{short, fromRow} {
		if rec, err := recordOf(s.Acquire(context.Background(), k, claim(time.Minute))); rec != nil || err != nil {
			t.Fatalf("Acquire after the TTL = %+v, %v; want a claim", rec, err)
		}
	}
	if n := statements(s, func() { replay(t, s, long) }); n != 0 {
		t.Fatalf("a replay of the long-lived record ran %d statements", n)
	}
}

// The tier holds at most local_cache bytes: the oldest records leave it
// first, and are then read from the table.
func TestTierSizeBound(t *testing.T) {
	s := openCached(t, shared.DSN(), 8<<10)
	keys := make([]store.Key, 20)
	body := strings.Repeat("x", 1000)
	for i := range keys {
		keys[i] = storetest.NewKey()
		complete(t, s, keys[i], body, time.Hour)
	}
	cached := 0
	for i := len(keys) - 1; i >= 0; i-- {
		if statements(s, func() { replay(t, s, keys[i]) }) == 0 {
			cached++
			if i < len(keys)-cached {
				t.Errorf("record %d of %d was in the tier while a newer one was not", i+1, len(keys))
			}
		}
	}
	if cached < 4 || cached > 7 {
		t.Fatalf("%d records of 1 KB in an 8 KiB tier", cached)
	}
}

// Configs that share a pool share its tier of one size, and the last to
// leave it empties it.
func TestTierSharedAcrossReloads(t *testing.T) {
	table := newTable()
	a := live(t, storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, LocalCache: 1 << 20}))
	b := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table, LocalCache: 1 << 20})
	if a.tier != b.tier {
		t.Fatal("a reload got a tier of its own")
	}
	k := storetest.NewKey()
	complete(t, a, k, "kept", time.Hour)
	a.Cleanup()
	if n := statements(b, func() { replay(t, b, k) }); n != 0 {
		t.Fatalf("the new config's replay ran %d statements", n)
	}
	b.Cleanup()
	if b.tier.Get(k) != nil {
		t.Fatal("a tier that every config left still serves")
	}
}

// BenchmarkReplayLocalCache is BenchmarkReplay's record replayed from the
// tier.
func BenchmarkReplayLocalCache(b *testing.B) {
	s := openCached(b, shared.DSN(), 1<<20)
	k := storetest.BenchmarkReplay(b, s, storetest.JSONResponse())
	if statements(s, func() { s.Acquire(context.Background(), k, claim(time.Minute)) }) != 0 {
		b.Fatal("the replays did not come from the tier")
	}
}
