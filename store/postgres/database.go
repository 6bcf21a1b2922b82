package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// The reaper deletes expired rows only to bound the table's size.
const (
	reapBatch   = 1000
	reapTimeout = 30 * time.Second
)

// reapInterval is a variable for tests; each database reads it once.
var reapInterval = time.Minute

// errReaperBusy means another store, in any process, is reaping the table.
var errReaperBusy = errors.New("another instance is reaping")

// database is the pool, statements, reaper and listener of one table.
type database struct {
	pool      *pgxpool.Pool
	lost      *lostSessions
	batch     *batcher // nil with pipelining off
	q         queries
	events    *listener
	deadlines *deadlines
	qualified string
	ddl       string // DDL under the table's advisory lock
	reapLock  int64
	logger    *zap.Logger

	// ready is set once the table is known to exist (or create_table is
	// off); until then every call tries to create it. With create_table
	// on, a call that finds the table gone clears it (dropped).
	create bool
	ready  atomic.Bool
	warned atomic.Bool
	// ensuring lets one caller at a time run the DDL; a channel, so that
	// waiting respects the caller's context.
	ensuring chan struct{}

	stop context.CancelFunc
	done chan struct{}
}

// newDatabase creates the pool, which connects lazily, and starts the
// reaper; neither fails when PostgreSQL is down.
func newDatabase(cfg *pgxpool.Config, schema, table string, create, pipelining bool, losses *prometheus.CounterVec, logger *zap.Logger) (*database, error) {
	// Copied before the pool may change it.
	listenCfg := cfg.ConnConfig.Copy()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	name := qualify(schema, table)
	channel := channelName(table)
	ctx, stop := context.WithCancel(context.Background())
	db := &database{
		pool:      pool,
		lost:      new(lostSessions),
		q:         newQueries(name, quoteLiteral(channel)),
		events:    newListener(listenCfg, channel, losses, logger),
		qualified: name,
		ddl:       "SELECT pg_advisory_xact_lock(" + strconv.FormatInt(lockID("ddl", name), 10) + ");\n" + DDL(schema, table),
		reapLock:  lockID("reap", name),
		deadlines: newDeadlines(),
		logger:    logger,
		create:    create,
		ensuring:  make(chan struct{}, 1),
		stop:      stop,
		done:      make(chan struct{}),
	}
	if pipelining {
		// As many statements go alone as the pool has connections: below
		// that, a statement queued behind another would only wait.
		db.batch = &batcher{pool: pool, lost: db.lost, wires: int(cfg.MaxConns)}
	}
	db.ready.Store(!create)
	go db.run(ctx, reapInterval)
	return db, nil
}

// Destruct stops the listener and the reaper and closes the pool.
func (db *database) Destruct() error {
	db.events.close()
	db.stop()
	<-db.done
	db.pool.Close()
	db.deadlines.stop()
	return nil
}

// query runs sql, a statement of one key, with r.args[:nargs], and scans
// its row into r.dest: found is false when it returned none. ctx bounds
// it; caller, the context it was bound from, withdraws it from a batch's
// queue when its caller leaves (batch.go).
func (db *database) query(ctx, caller context.Context, sql string, r *row, nargs int) (found bool, err error) {
	if db.batch != nil {
		return db.batch.query(ctx, caller, sql, r, nargs)
	}
	return runAlone(ctx, db.pool, db.lost, sql, r.args[:nargs], r)
}

// exec runs sql, a statement of one key, which args begin with, and
// reports whether it affected a row.
func (db *database) exec(ctx, caller context.Context, sql string, args []any) (bool, error) {
	if db.batch != nil {
		return db.batch.exec(ctx, caller, sql, args)
	}
	return runAlone(ctx, db.pool, db.lost, sql, args, nil)
}

// lockID names an advisory lock after the table, so that the stores of
// different tables never wait for each other.
func lockID(purpose, qualified string) int64 {
	h := fnv.New64a()
	h.Write([]byte("caddy-idempotency/" + purpose + "/" + qualified))
	return int64(h.Sum64())
}

// ensure creates the table unless it is ready; then it costs nothing.
func (db *database) ensure(ctx context.Context) error {
	if db.ready.Load() {
		return nil
	}
	select {
	case db.ensuring <- struct{}{}:
	case <-ctx.Done():
		return store.Unavailable("creating table", ctx.Err())
	}
	defer func() { <-db.ensuring }()
	if db.ready.Load() {
		return nil
	}
	// Checking first lets a role without CREATE privilege use a table that
	// migrations made, and spares a schema lock when many instances start.
	var exists bool
	err := db.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.qualified).Scan(&exists)
	if err == nil && !exists {
		// Simple statements in one message run as one transaction, so the
		// advisory lock serializes instances: concurrent CREATE ... IF NOT
		// EXISTS can still collide.
		_, err = db.pool.Exec(ctx, db.ddl)
	}
	if err != nil {
		if !db.warned.Swap(true) {
			db.logger.Warn("cannot create the idempotency table yet; requests follow on_store_error until it exists",
				zap.String("table", db.qualified), zap.Error(err))
		}
		return store.Unavailable("creating table", err)
	}
	if db.warned.Load() {
		db.logger.Info("idempotency table is ready", zap.String("table", db.qualified))
	}
	db.ready.Store(true)
	return nil
}

// dropped reports whether err says that the table does not exist. With
// create_table on, the table was dropped since it was made ready: the
// next call, or the reaper's next run, creates it again.
func (db *database) dropped(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" { // undefined_table
		return false
	}
	if db.create && db.ready.Swap(false) {
		db.warned.Store(true) // ensure says when it is back
		db.logger.Warn("the idempotency table is gone; creating it again; requests follow on_store_error until it exists",
			zap.String("table", db.qualified))
	}
	return true
}

// run creates the table as soon as the database answers, and reaps
// expired rows every interval until Destruct.
func (db *database) run(ctx context.Context, interval time.Duration) {
	defer close(db.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		ensureCtx, cancel := context.WithTimeout(ctx, reapTimeout)
		_ = db.ensure(ensureCtx) // nothing to do once ready, as with create_table off
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !db.ready.Load() {
			continue
		}
		reapCtx, cancel := context.WithTimeout(ctx, reapTimeout)
		n, err := db.reap(reapCtx, reapBatch, nil)
		cancel()
		switch {
		case err != nil && !errors.Is(err, errReaperBusy) && ctx.Err() == nil:
			db.logger.Warn("deleting expired idempotency records", zap.Int64("deleted", n), zap.Error(err))
		case n > 0:
			db.logger.Debug("deleted expired idempotency records", zap.Int64("deleted", n))
		}
	}
}

// reap deletes expired rows, batch per statement so that none holds many
// row locks or runs long. A session advisory lock makes it the one reaper
// of the table across processes, or errReaperBusy. afterBatch, if set,
// runs after each batch (for tests).
func (db *database) reap(ctx context.Context, batch int, afterBatch func()) (deleted int64, err error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return 0, store.Unavailable("reaping", err)
	}
	var locked bool
	err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", db.reapLock).Scan(&locked)
	if err != nil {
		// The lock may be held: drop the session, which releases it.
		closeConn(conn.Hijack())
		return 0, store.Unavailable("reaping", err)
	}
	if !locked {
		conn.Release()
		return 0, errReaperBusy
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", db.reapLock); err != nil {
			closeConn(conn.Hijack())
			return
		}
		conn.Release()
	}()
	for {
		tag, err := conn.Exec(ctx, db.q.reap, batch)
		if err != nil {
			db.dropped(err)
			return deleted, store.Unavailable("reaping", err)
		}
		deleted += tag.RowsAffected()
		if afterBatch != nil {
			afterBatch()
		}
		if tag.RowsAffected() < int64(batch) {
			return deleted, nil
		}
	}
}

// closeConn closes a connection, ending its session and so its advisory
// locks.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
