package file

import (
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit lets concurrent completions share one write transaction, and
// so one fsync, without making a lone request wait: every completion syncs
// the file, and one sync at a time is what bounds the store's throughput.
//
// A writer that finds no commit in progress commits at once, alone. Writers
// that arrive meanwhile queue up; when the commit ends, the first of them
// commits the whole queue in one transaction, and so on. (bbolt's own Batch
// waits up to MaxBatchDelay for company before committing, which would make
// every request at low concurrency slower, and may run a function twice.)
//
// Each function runs once, in queue order, inside the shared transaction,
// and its error is its own: it must return before writing anything when it
// fails (the owner check does), so that it leaves no trace in a transaction
// that commits the others. If the commit itself fails, every writer in it
// gets that error, and none of their writes were made.
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

// update runs fn in a write transaction, possibly shared with other
// writers, and returns once that transaction is committed and synced.
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

	// Hand the next commit to the first writer that queued meanwhile:
	// this one has its answer and should not keep committing for others.
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
	err := g.db.Update(func(tx *bolt.Tx) (err error) {
		// A panicking write must not leave the others waiting for ever, nor
		// the queue without a leader: it fails the whole transaction.
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("a write in the transaction panicked: %v", p)
			}
		}()
		for _, w := range batch {
			w.err = w.fn(tx)
		}
		return nil
	})
	for _, w := range batch {
		if err != nil {
			w.err = err
		}
		w.done <- struct{}{} // buffered: the leader never reads its own
	}
}
