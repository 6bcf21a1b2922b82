package file

import (
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit lets concurrent completions share one write transaction, and
// so one fsync, without making a lone request wait (as bbolt's Batch does,
// which may also run a function twice): a writer that finds no commit in
// progress commits at once; the first writer that queued meanwhile then
// commits the whole queue.
//
// Each function runs once, in queue order, in the shared transaction, and
// its error is its own: it must fail before writing anything, so that it
// leaves no trace in a transaction that commits the others. If the commit
// fails, or anything in the transaction panics, every writer in it gets
// that error.
type groupCommit struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*pendingWrite
	running bool // a writer is committing; newcomers queue
}

type pendingWrite struct {
	fn   func(*bolt.Tx) error
	err  error
	lead bool          // woken to commit the queue rather than with a result
	done chan struct{} // one send: a result, or the lead
}

// update runs fn in a write transaction, possibly shared, and returns once
// it is committed and synced.
func (g *groupCommit) update(fn func(*bolt.Tx) error) error {
	w := &pendingWrite{fn: fn, done: make(chan struct{}, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if !lead {
		<-w.done
		if !w.lead {
			return w.err
		}
	}

	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	g.commit(batch)

	// Hand the next commit to the first writer that queued meanwhile.
	g.mu.Lock()
	if len(g.queue) == 0 {
		g.running = false
	} else {
		next := g.queue[0]
		next.lead = true
		next.done <- struct{}{}
	}
	g.mu.Unlock()
	return w.err
}

func (g *groupCommit) commit(batch []*pendingWrite) {
	err := g.transact(batch)
	for _, w := range batch {
		if err != nil {
			w.err = err
		}
		w.done <- struct{}{} // buffered: the leader never reads its own
	}
}

// transact runs batch in one write transaction. A panic, in a write or in
// bbolt's commit, is the error of the whole transaction rather than leave
// the others waiting and the queue without a leader; bbolt has rolled the
// transaction back, or closed it, before it lets the panic through.
func (g *groupCommit) transact(batch []*pendingWrite) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the write transaction panicked: %v", p)
		}
	}()
	return g.db.Update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			w.err = w.fn(tx)
		}
		return nil
	})
}
