package postgres

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batcher sends the statements of one key (claims, completions, releases,
// renewals, watches) of one pool. A statement that finds fewer than wires
// others on the wire (one per pool connection) goes alone, at once,
// exactly as without pipelining; those arriving while all are busy queue,
// and go in batches, one each time a wire frees. A queued statement whose
// caller leaves is withdrawn; one taken into a batch waits for it.
//
// A batch is one pgx batch: every statement in one pipeline, one round
// trip, and one implicit transaction, so that its claims and completions
// share one commit, one WAL flush. Its statements are in key order, so
// that two batches take their rows in the same order and never deadlock.
// A statement that fails rolls the transaction back: it runs again alone,
// its failure its own, and the others run again as a batch (runBatch).
type batcher struct {
	pool  *pgxpool.Pool
	lost  *lostSessions
	wires int // statements or batches sent at once before calls queue: the pool's size

	mu     sync.Mutex
	onWire int // statements or batches being sent and read
	queue  []*call
}

// A batch holds at most maxBatchCalls statements and about maxBatchBytes
// of arguments: each holds its rows' locks until the batch commits, and
// pgx writes a batch whole before reading its results.
const (
	maxBatchCalls = 16
	maxBatchBytes = 256 << 10
)

// call is one statement: a query that returns the key's row into r, or,
// with r nil, an owner-checked statement whose affected row count is its
// answer. ctx bounds it; caller is the context of its caller, who may
// leave before the bound (deadline.go).
type call struct {
	sql  string
	args []any // args[0] is the key
	r    *row
	size int
	ctx  context.Context
	done chan []*call // nil: the call's answer is in; a batch: send it

	found bool // a row came back (r), or was affected
	err   error
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan []*call, 1)} }}

// query runs sql with r.args[:nargs], which begin with the key, and scans
// its row into r.dest; found is false when it returned none. The
// statement is bounded by ctx; caller, its caller's context, withdraws it
// if it leaves while the statement waits in the queue.
func (b *batcher) query(ctx, caller context.Context, sql string, r *row, nargs int) (found bool, err error) {
	return b.do(ctx, caller, sql, r.args[:nargs], r)
}

// exec runs an owner-checked statement, whose first argument is the key,
// and reports whether it affected a row.
func (b *batcher) exec(ctx, caller context.Context, sql string, args []any) (bool, error) {
	return b.do(ctx, caller, sql, args, nil)
}

func (b *batcher) do(ctx, caller context.Context, sql string, args []any, r *row) (bool, error) {
	if err := ctx.Err(); err != nil {
		// As pgx would answer it, without queueing a statement nobody waits for.
		return false, err
	}
	b.mu.Lock()
	if b.onWire < b.wires {
		b.onWire++
		b.mu.Unlock()
		// Deferred, so that a panic cannot leave the wire taken.
		defer b.handOver()
		return runAlone(ctx, b.pool, b.lost, sql, args, r)
	}
	c := callPool.Get().(*call)
	c.sql, c.args, c.r, c.size, c.ctx = sql, args, r, argBytes(args), ctx
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	var batch []*call
	var left context.Context
	select {
	case batch = <-c.done:
	case <-ctx.Done():
		left = ctx
	case <-caller.Done():
		left = caller
	}
	if left != nil {
		if b.withdraw(c) {
			// Never sent: the caller that left runs nothing.
			c.err = left.Err()
		} else {
			batch = <-c.done // taken into a batch already, which may be sending it
		}
	}
	if batch != nil {
		b.send(c, batch)
	}
	found, err := c.found, c.err
	*c = call{done: c.done}
	callPool.Put(c)
	return found, err
}

// argBytes is about how many bytes args take on the wire.
func argBytes(args []any) int {
	n := 0
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			n += len(v)
		default:
			n += 8
		}
	}
	return n
}

// withdraw takes c out of the queue, unless a batch has taken it.
func (b *batcher) withdraw(c *call) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.queue, c)
	if i < 0 {
		return false
	}
	b.queue = slices.Delete(b.queue, i, i+1)
	return true
}

// handOver gives the wire to the first queued call, with a batch, or frees it.
func (b *batcher) handOver() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.onWire--
	} else {
		b.sendFirst()
	}
	b.mu.Unlock()
}

// sendFirst gives the queue's first batch to its first call. b.mu is held.
func (b *batcher) sendFirst() {
	queue := b.queue
	n, size := 1, queue[0].size
	for n < len(queue) && n < maxBatchCalls && size+queue[n].size <= maxBatchBytes {
		size += queue[n].size
		n++
	}
	b.queue = append(make([]*call, 0, cap(queue)), queue[n:]...)
	queue[0].done <- queue[:n] // buffered: never blocks
}

// send runs batch, whose first call is leader's, then hands the wire over
// and gives every other call its answer.
func (b *batcher) send(leader *call, batch []*call) {
	defer func() {
		b.handOver()
		for _, c := range batch {
			if c != leader {
				c.done <- nil
			}
		}
	}()
	ctx, cancel := batchContext(batch)
	defer cancel()
	calls := slices.Clone(batch) // sorted and cut down below; batch keeps who to answer
	slices.SortStableFunc(calls, func(a, b *call) int { return bytes.Compare(a.args[0].([]byte), b.args[0].([]byte)) })
	for len(calls) > 1 {
		failed := runBatch(ctx, b.pool, b.lost, calls)
		if failed < 0 {
			return
		}
		// Nothing of the batch committed: the statement that failed runs
		// alone, so that its failure is its own, and the others again.
		c := calls[failed]
		c.found, c.err = runAlone(ctx, b.pool, b.lost, c.sql, c.args, c.r)
		calls = slices.Delete(calls, failed, failed+1)
	}
	if len(calls) == 1 {
		c := calls[0]
		c.found, c.err = runAlone(ctx, b.pool, b.lost, c.sql, c.args, c.r)
	}
}

// batchContext bounds a batch by its calls' latest deadline, if all have
// one; a caller leaving must not cancel the others' statements.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].ctx), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}

// runAlone runs one statement in a transaction of its own.
func runAlone(ctx context.Context, pool *pgxpool.Pool, lost *lostSessions, sql string, args []any, r *row) (found bool, err error) {
	err = onConn(ctx, pool, lost, func(conn *pgx.Conn) error {
		if r == nil {
			tag, err := conn.Exec(ctx, sql, args...)
			found = err == nil && tag.RowsAffected() > 0
			return err
		}
		r.reset()
		err := conn.QueryRow(ctx, sql, args...).Scan(r.dest[:r.ndest]...)
		found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	return found, err
}

// runBatch runs calls, in key order, as one batch, and gives each its
// answer; or, when a statement failed, which rolled the batch back,
// returns its index and answers none.
func runBatch(ctx context.Context, pool *pgxpool.Pool, lost *lostSessions, calls []*call) (failed int) {
	var batch pgx.Batch
	for _, c := range calls {
		batch.Queue(c.sql, c.args...)
	}
	failed = -1
	err := onConn(ctx, pool, lost, func(conn *pgx.Conn) error {
		var err error
		failed, err = sendBatch(ctx, conn, &batch, calls)
		return err
	})
	if failed >= 0 {
		return failed
	}
	for _, c := range calls {
		c.err = err
	}
	return -1
}

// sendBatch sends batch, of calls, on conn, and gives each its answer; or,
// when a statement failed, returns its index (failed) and answers none.
// err is the batch's: its connection's, or its commit's.
func sendBatch(ctx context.Context, conn *pgx.Conn, batch *pgx.Batch, calls []*call) (failed int, err error) {
	br := conn.SendBatch(ctx, batch)
	failed = -1
	for i, c := range calls {
		if c.r == nil {
			var tag pgconn.CommandTag
			tag, err = br.Exec()
			c.found = err == nil && tag.RowsAffected() > 0
		} else {
			c.r.reset()
			err = br.QueryRow().Scan(c.r.dest[:c.r.ndest]...)
			c.found = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
		if refused(err) {
			// The server refused the statement: it skips the rest, and
			// rolls the transaction back.
			failed = i
			break
		}
		if err != nil {
			break // the connection, or the batch's deadline
		}
	}
	closeErr := br.Close()
	if failed >= 0 {
		return failed, nil
	}
	if err == nil {
		// A commit that failed, or a connection lost before its answer:
		// the batch's outcome is unknown, as a lone statement's would be.
		err = closeErr
	}
	return -1, err
}

// refused reports whether err is the server's refusal of a statement, an
// ERROR, after which the connection goes on; not a FATAL one, which ends
// the session (the server shutting down, the backend terminated).
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR"
}
