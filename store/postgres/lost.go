package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A statement whose connection is lost before its answer can run on in its
// server session. pgx cancels it over a connection of its own, but that
// one can be lost too; a claim waiting for a row lock then lands once the
// lock frees, after its caller was told that the store failed and has
// withdrawn it, and is later taken for a dead owner's claim. So the
// sessions of lost connections are noted, and a release that finds nothing
// is no answer while one of them is still on the server (Release). The
// server ends a session whose client has gone when it next reads from it.
//
// A session is known by its process ID. One the server reuses for a new
// session keeps it noted until that one ends too: releases wait longer,
// never less.
type lostSessions struct {
	n    atomic.Int32 // len(pids), read by every release without the lock
	mu   sync.Mutex
	pids []uint32
}

// maxLostSessions bounds the sessions noted: past it, the oldest is
// forgotten, as all were before a release could wait for them.
const maxLostSessions = 1024

// errLostSessionRuns is a release's answer when it found nothing while a
// lost session may still write the claim.
var errLostSessionRuns = errors.New("the claim is not in the table, but the session of a lost connection, which may hold it, is still on the server")

// onConn runs f on a connection of pool, and notes its session if f
// failed and the connection was closed with it.
func onConn(ctx context.Context, pool *pgxpool.Pool, lost *lostSessions, f func(*pgx.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err // nothing was sent
	}
	defer conn.Release()
	err = f(conn.Conn())
	if err != nil && conn.Conn().IsClosed() {
		lost.add(conn.Conn().PgConn().PID())
	}
	return err
}

func (l *lostSessions) add(pid uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pids) == maxLostSessions {
		l.pids = slices.Delete(l.pids, 0, 1)
	}
	l.pids = append(l.pids, pid)
	l.n.Store(int32(len(l.pids)))
}

// running reports whether a noted session is still on the server, and
// forgets those that are gone.
func (l *lostSessions) running(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	if l.n.Load() == 0 {
		return false, nil
	}
	l.mu.Lock()
	noted := slices.Clone(l.pids)
	l.mu.Unlock()
	var live []uint32
	err := pool.QueryRow(ctx, "SELECT coalesce(array_agg(pid::bigint), '{}') FROM pg_stat_activity WHERE pid = ANY($1::int[])",
		noted).Scan(&live)
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pids = slices.DeleteFunc(l.pids, func(pid uint32) bool {
		return slices.Contains(noted, pid) && !slices.Contains(live, pid)
	})
	l.n.Store(int32(len(l.pids)))
	return len(live) > 0, nil
}
