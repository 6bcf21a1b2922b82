package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// A client that leaves while its claim waits for the store's only pooled
// connection, which a slow call holds, is not a store error: its own
// result and 499, no error log, no store error counted, and with fail_open
// no unprotected run. The slow call's request runs once the store answers.
func TestClientGoneWhileClaimWaits(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		srv := testredis.Start(t)
		raw := json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"],"pool_size":1,"read_timeout":"5s"}`)
		testClientGone(t, raw, false, func(t *testing.T, h *Handler) func() {
			// Redis answers no other client until the pause ends: the
			// store's one connection waits for its reply.
			ctx := context.Background()
			if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			return func() { srv.Client().Do(ctx, "CLIENT", "UNPAUSE") }
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := sharedPostgres(t).DSN()
		table := fmt.Sprintf("idem_gone_%d", testSeq.Add(1))
		q, _ := json.Marshal(dsn)
		raw := json.RawMessage(`{"module":"postgres","dsn":` + string(q) + `,"table":"` + table + `","max_conns":1}`)
		// The store's calls run on when their client leaves, bounded by
		// its call timeout (deadline.go): the held request's client
		// leaves too, and both wait for that bound.
		testClientGone(t, raw, true, func(t *testing.T, h *Handler) func() {
			// An uncommitted claim of the held key makes the store's
			// insert wait for it, on the pool's one connection.
			do(h, &backend{}, post("/gone", "creates-the-table", "x"))
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			k := store.NewKey(goneScope, "held")
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, state, token, endpoint, fingerprint, expires_at)
				VALUES ($1, 'in_progress', $2, ''::bytea, $3, now() + interval '1 minute')`, k[:], make([]byte, 16), make([]byte, 32)); err != nil {
				t.Fatal(err)
			}
			return func() { tx.Rollback(ctx); conn.Close(ctx) }
		})
	})
}

// goneScope is the scope of the clients that leave: one that is set, so
// that the only warnings are the ones a client that leaves would cause.
const goneScope = "tenant-1"

func testClientGone(t *testing.T, raw json.RawMessage, heldLeaves bool, hold func(*testing.T, *Handler) func()) {
	h, name := provisionNamed(t, raw, func(h *Handler) { h.OnStoreError = app.FailOpen; h.Scope = goneScope })
	logs := watchLogs(h)
	b := &backend{}
	unhold := hold(t, h)
	defer unhold()
	held := make(chan response, 1)
	heldCtx, heldLeave := context.WithCancel(context.Background())
	defer heldLeave()
	go func() { held <- do(h, b, post("/gone", "held", "x").WithContext(heldCtx)) }()
	time.Sleep(300 * time.Millisecond) // its claim has taken the connection
	if heldLeaves {
		heldLeave()
	}

	storeErrs := collectors.storeErrs.WithLabelValues(name, "acquire")
	errsBefore, goneBefore, runsBefore := testutil.ToFloat64(storeErrs), count("client_gone"), b.runs.Load()
	ctx, leave := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, leave)
	start := time.Now()
	left := do(h, b, post("/gone", "left", "x").WithContext(ctx))
	t.Logf("the client that left was answered %v after it came", time.Since(start))

	var heldAnswer response
	if heldLeaves {
		heldAnswer = <-held
	}
	for what, r := range map[string]response{"left while waiting for the connection": left, "left while holding it": heldAnswer} {
		if r.ResponseRecorder == nil {
			continue
		}
		if r.Code != statusClientClosed || r.placeholder("http.idempotency.result") != "client_gone" || r.err != nil {
			t.Errorf("the client that %s got %d, result %q, error %v; want 499, client_gone, nil",
				what, r.Code, r.placeholder("http.idempotency.result"), r.err)
		}
	}
	if n := b.runs.Load() - runsBefore; n != 0 {
		t.Errorf("the requests of clients that left ran %d times, want never", n)
	}
	if n := testutil.ToFloat64(storeErrs) - errsBefore; n != 0 {
		t.Errorf("store_errors_total{operation=acquire} grew by %v, want 0", n)
	}
	if n, want := count("client_gone")-goneBefore, map[bool]float64{false: 1, true: 2}[heldLeaves]; n != want {
		t.Errorf("requests_total{result=client_gone} grew by %v, want %v", n, want)
	}
	for _, e := range logs.All() {
		if e.Level >= zapcore.WarnLevel {
			t.Errorf("logged %s %q %v", e.Level, e.Message, e.ContextMap())
		}
	}
	if heldLeaves {
		return
	}
	unhold()
	if r := <-held; r.Code != 201 || b.runs.Load()-runsBefore != 1 {
		t.Errorf("the held request got %d and ran %d times once the store answered, want 201 and once", r.Code, b.runs.Load()-runsBefore)
	}
}
