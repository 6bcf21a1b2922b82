package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// instances returns two stores on one table with pools of their own, as
// two Caddy instances would have: the options differ only in max_conns,
// which gives each its own pool, hence its own listener.
func instances(t testing.TB, dsn, schema, table string, localCache int64) (a, b *Store) {
	t.Helper()
	a = storetest.Provision(t, &Store{DSN: dsn, Schema: schema, Table: table, MaxConns: 3, LocalCache: localCache})
	b = storetest.Provision(t, &Store{DSN: dsn, Schema: schema, Table: table, MaxConns: 4, LocalCache: localCache})
	if a.db == b.db || a.db.events == b.db.events {
		t.Fatal("the two instances share a pool")
	}
	return a, b
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A waiter on one instance is woken when the owner on another completes or
// releases the claim, and by a purge; a renewal wakes nobody.
func TestNotifyWakesWaitersOfAnotherInstance(t *testing.T) {
	waiter, owner := instances(t, shared.DSN(), "", newTable(), 0)
	storetest.NotifyWakes(t, waiter, owner)
}

// Odd table and schema names make a channel that LISTEN and pg_notify
// spell alike, and one too long for PostgreSQL is cut to fit.
func TestNotifyOddNames(t *testing.T) {
	for _, names := range []struct{ schema, table string }{
		{`Odd'"\Schema`, `odd'"\ table` + newTable()},
		{"", strings.Repeat("é", 27) + newTable()}, // a channel name over 63 bytes
	} {
		t.Run(names.table, func(t *testing.T) {
			if names.schema != "" {
				sqlExec(t, shared.DSN(), "CREATE SCHEMA IF NOT EXISTS "+qualify("", names.schema))
			}
			waiter, owner := instances(t, shared.DSN(), names.schema, names.table, 0)
			storetest.NotifyWakes(t, waiter, owner)
		})
	}
}

func TestChannelName(t *testing.T) {
	if got := channelName("idempotency_keys"); got != "idempotency_keys:events" {
		t.Errorf("channelName = %q", got)
	}
	long := strings.Repeat("é", 40)
	a, b := channelName(long+"a"), channelName(long+"b")
	if a == b || len(a) > maxIdentifier || !utf8.ValidString(a) || !strings.HasPrefix(a, "éé") {
		t.Errorf("channels of long names: %q and %q", a, b)
	}
	if got := quoteLiteral(`it's a \ name`); got != `E'it''s a \\ name'` {
		t.Errorf("quoteLiteral = %s", got)
	}
}

// Instances that name one table differently, one with its schema and one
// through the search_path, hear each other.
func TestNotifyAcrossSpellingsOfOneTable(t *testing.T) {
	table := newTable()
	waiter := storetest.Provision(t, &Store{DSN: shared.DSN(), Schema: "public", Table: table})
	// The two spellings take different DDL locks: create the table once.
	if err := waiter.db.ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	owner := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: table})
	storetest.NotifyWakes(t, waiter, owner)
}

// Notify arranges nothing for a claim that has already ended, and says so.
func TestNotifyReportsAnEndedClaim(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if storetest.Notify(t, s, k) {
		t.Fatal("Notify of an absent key reported a claim in progress")
	}
	s.Acquire(ctx, k, c)
	if err := s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if storetest.Notify(t, s, k) {
		t.Fatal("Notify of a completed key reported a claim in progress")
	}
	if rec, err := recordOf(s.Acquire(ctx, k, claim(time.Minute))); err != nil || rec.Status != 200 {
		t.Fatalf("the completed record after Notify = %+v, %v", rec, err)
	}
}

// The mark is the claim's status, which a claim does not show: the owner
// renews and completes it as before, and a takeover drops it.
func TestWatchedClaimIsTheSameClaim(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	s.Acquire(ctx, k, c)
	for range 2 { // a second waiter marks it again
		if !storetest.Notify(t, s, k) {
			t.Fatal("Notify found no claim in progress")
		}
	}
	rec, err := recordOf(s.Acquire(ctx, k, claim(time.Minute)))
	if err != nil || rec == nil || rec.State != store.InProgress || rec.Token != c.Token || rec.Status != 0 {
		t.Fatalf("the watched claim reads as %+v, %v", rec, err)
	}
	if rec, _, err := s.Lookup(ctx, k); err != nil || rec.Status != 0 {
		t.Fatalf("Lookup of the watched claim = %+v, %v", rec, err)
	}
	if err := s.Renew(ctx, k, c.Token, time.Minute); err != nil {
		t.Fatalf("Renew of a watched claim: %v", err)
	}
	if err := s.Complete(ctx, k, c, &store.Response{Status: 201}, time.Minute); err != nil {
		t.Fatalf("Complete of a watched claim: %v", err)
	}
	if rec, err := recordOf(s.Acquire(ctx, k, claim(time.Minute))); err != nil || rec.Status != 201 {
		t.Fatalf("the completed record = %+v, %v", rec, err)
	}

	dead := storetest.NewKey()
	s.Acquire(ctx, dead, claim(time.Millisecond))
	storetest.Notify(t, s, dead)
	time.Sleep(5 * time.Millisecond)
	fresh := claim(time.Minute)
	if got, err := s.Acquire(ctx, dead, fresh); got.Record != nil || err != nil || !got.TookOver {
		t.Fatalf("takeover of a watched dead claim = %+v, %v", got, err)
	}
	var status int
	if err := begin(t).QueryRow(ctx, "SELECT status FROM "+s.db.qualified+" WHERE key = $1", dead[:]).Scan(&status); err != nil || status != 0 {
		t.Fatalf("the claim that took over has status %d (%v), want 0: unwatched", status, err)
	}
}

// listen LISTENs to s's channel on a connection of the test's own.
func listen(t testing.TB, s *Store) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, shared.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, listenStatement(channelName(s.table))); err != nil {
		t.Fatal(err)
	}
	return conn
}

// received returns the payloads that conn receives within wait.
func received(t testing.TB, conn *pgx.Conn, wait time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			if time.Now().Before(deadline) {
				t.Fatalf("waiting for notifications: %v", err)
			}
			return got
		}
		got = append(got, n.Payload)
	}
}

// Nobody waits: neither a completion nor a release notifies. Someone
// waits: each notifies once. A purge always does, found or not.
func TestNotifiesOnlyWhenSomeoneWaits(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	conn := listen(t, s)
	ctx := context.Background()
	run := func(wait bool) (completed, released store.Key) {
		completed, released = storetest.NewKey(), storetest.NewKey()
		a, b := claim(time.Minute), claim(time.Minute)
		s.Acquire(ctx, completed, a)
		s.Acquire(ctx, released, b)
		if wait {
			storetest.Notify(t, s, completed)
			storetest.Notify(t, s, released)
		}
		if err := s.Complete(ctx, completed, a, &store.Response{Status: 200}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, released, b.Token); err != nil {
			t.Fatal(err)
		}
		return completed, released
	}
	run(false)
	if got := received(t, conn, 300*time.Millisecond); len(got) != 0 {
		t.Fatalf("a completion and a release nobody waited for notified %q", got)
	}
	completed, released := run(true)
	want := []string{string(store.AppendEvent(nil, store.EventEnded, completed)), string(store.AppendEvent(nil, store.EventEnded, released))}
	if got := received(t, conn, 300*time.Millisecond); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("a completion and a release someone waited for notified %q, want %q", got, want)
	}
	absent := storetest.NewKey()
	if _, err := s.Delete(ctx, absent); err != nil {
		t.Fatal(err)
	}
	if got := received(t, conn, 300*time.Millisecond); len(got) != 1 || got[0] != string(store.AppendEvent(nil, store.EventPurged, absent)) {
		t.Fatalf("a purge notified %q", got)
	}
}

// The mark and the end of a claim are serialized by the row's lock, in
// either order, and nothing slips between them.
func TestWatchAndEndSerialize(t *testing.T) {
	s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable()})
	conn := listen(t, s)
	ctx := context.Background()
	storetest.Notify(t, s, storetest.NewKey()) // starts the listener

	// A completion that waits for an uncommitted mark notifies once the
	// mark commits.
	k, c := storetest.NewKey(), claim(time.Minute)
	s.Acquire(ctx, k, c)
	tx := begin(t)
	if tag, err := tx.Exec(ctx, s.db.q.watch, k[:]); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("marking in a transaction: %v, %v", tag, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, k, c, &store.Response{Status: 200}, time.Minute) }()
	waitForLockWait(t, tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := received(t, conn, 300*time.Millisecond); len(got) != 1 || got[0] != string(store.AppendEvent(nil, store.EventEnded, k)) {
		t.Fatalf("a completion after a concurrent mark notified %q", got)
	}

	// A mark that waits for an uncommitted completion finds the claim
	// ended.
	k, c = storetest.NewKey(), claim(time.Minute)
	s.Acquire(ctx, k, c)
	tx = begin(t)
	if tag, err := tx.Exec(ctx, s.db.q.complete, k[:], c.Token[:], 200, nil, nil, false, false, false, int64(60e6)); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("completing in a transaction: %v, %v", tag, err)
	}
	type result struct {
		inProgress bool
		err        error
	}
	marked := make(chan result, 1)
	go func() {
		inProgress, err := s.Notify(ctx, k)
		marked <- result{inProgress, err}
	}()
	waitForLockWait(t, tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-marked; r.err != nil || r.inProgress {
		t.Fatalf("Notify racing a completion = %v, %v; want the claim ended", r.inProgress, r.err)
	}
	if got := received(t, conn, 300*time.Millisecond); len(got) != 0 {
		t.Fatalf("a completion before the mark notified %q", got)
	}
}

// waitForLockWait waits until a statement waits for a lock that tx holds.
func waitForLockWait(t testing.TB, tx pgx.Tx) {
	t.Helper()
	waitFor(t, "a statement to wait for the row's lock", func() bool {
		var waiting int
		if err := tx.Conn().QueryRow(context.Background(), "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
}

// A killed PostgreSQL drops the listener's connection: the loss is
// counted, Notify refuses until it is back, and it comes back by itself.
func TestListenerLossIsCountedAndRecovers(t *testing.T) {
	srv := testpg.Start(t)
	waiter, owner := instances(t, srv.DSN(), "", newTable(), 0)
	vec, err := store.SubscriptionLosses(nil)
	if err != nil {
		t.Fatal(err)
	}
	losses := vec.WithLabelValues(waiter.name)
	storetest.Notify(t, waiter, storetest.NewKey()) // starts the listener
	before := testutil.ToFloat64(losses)

	srv.Kill()
	waitFor(t, "the loss to be counted", func() bool { return testutil.ToFloat64(losses) == before+1 })
	if _, err := waiter.Notify(context.Background(), storetest.NewKey()); !errors.Is(err, store.ErrNotListening) {
		t.Fatalf("Notify while the listener is down = %v, want ErrNotListening", err)
	}
	srv.Restart(t)
	waitFor(t, "the listener to be back", waiter.db.events.listening)
	// Each pool finds its connection from before the kill dead at its
	// first use.
	for _, s := range []*Store{waiter, owner} {
		waitFor(t, "the pool to connect again", func() bool {
			_, err := s.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute))
			return err == nil
		})
	}
	storetest.NotifyWakes(t, waiter, owner)
	if got := testutil.ToFloat64(losses); got != before+1 {
		t.Fatalf("%v losses counted for one kill", got-before)
	}
}

// A % in the table name is a character like any other: completions and
// releases run and notify the table's own channel, and waiters on another
// instance wake.
func TestPercentInTableName(t *testing.T) {
	for _, table := range []string{"idem%keys" + newTable(), `a%'b` + newTable(), "%s%d%%{channel}{table}" + newTable()} {
		t.Run(table, func(t *testing.T) {
			waiter, owner := instances(t, shared.DSN(), "", table, 0)
			storetest.NotifyWakes(t, waiter, owner)
		})
	}
}
