package redis

import (
	"context"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// batcher pipelines store calls automatically. A call that finds nothing
// on the wire goes at once, alone, as go-redis would send it; calls that
// arrive while one is on the wire queue up, and when it ends the first of
// them sends the whole queue as one pipeline: one write, one read, one
// wake-up of Redis for all of them (a Cluster's pipeline is split per
// node and follows MOVED and ASK per command, as go-redis does). A queue
// that fills a batch does not wait: it goes at once, on another
// connection, so that a slow round trip does not cap what a node is sent.
// So the calls in flight share their round trips while Caddy is busy, and
// add nothing when it is idle.
//
// Each call keeps its own reply and its own error: Redis answers the
// commands of a pipeline one by one, and go-redis gives each command its
// own. A transport error fails the commands it cut off, as it would have
// failed them one by one.
//
// A queued call whose caller leaves is withdrawn, never sent, as a call
// waiting for a pooled connection would be. Once a batch has taken it,
// the call waits for the batch even when its caller leaves: the batch may
// be writing the call's arguments, which the store reuses once the call
// returns. The wait is bounded by the batch's timeouts, as a lone call
// is: a call waits at most for one batch before its own.
//
// On a Cluster each master has a lane of its own, so that a slow or dead
// node delays only the calls for its slots.
type batcher struct {
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // nil: one lane for all
	single  lane
	lanes   sync.Map // *goredis.Client of a master → *lane
}

// lane is the calls for one node: at most one call or batch on the wire
// while the queue waits, and one more for every batch that filled up.
type lane struct {
	mu     sync.Mutex
	onWire int // calls or batches being sent and read
	queue  []*queued
	queued int // the queue's size, about, in bytes of arguments
}

func newBatcher(client goredis.UniversalClient) *batcher {
	cluster, _ := client.(*goredis.ClusterClient)
	return &batcher{client: client, cluster: cluster}
}

// lane picks the lane of cmd's master. A command whose master is not
// known (the slot map is not loaded, or the key not found) takes the
// shared lane, where go-redis routes it as usual.
func (b *batcher) lane(ctx context.Context, cmd goredis.Cmder) *lane {
	if b.cluster == nil {
		return &b.single
	}
	key, ok := commandKey(cmd)
	if !ok {
		return &b.single
	}
	master, err := b.cluster.MasterForKey(ctx, key)
	if err != nil {
		return &b.single
	}
	if l, ok := b.lanes.Load(master); ok {
		return l.(*lane)
	}
	l, _ := b.lanes.LoadOrStore(master, new(lane))
	return l.(*lane)
}

// commandKey is the key of the store's commands: SET's first argument, a
// script's first key.
func commandKey(cmd goredis.Cmder) (string, bool) {
	args := cmd.Args()
	pos := 1
	if len(args) > 0 && args[0] != "set" {
		pos = 3
	}
	if len(args) <= pos {
		return "", false
	}
	key, ok := args[pos].(string)
	return key, ok
}

type queued struct {
	ctx  context.Context
	cmd  goredis.Cmder
	size int            // of its arguments, about
	done chan []*queued // nil: the call's reply is in; a batch: send it
}

// A batch is written within write_timeout and all its replies read
// within read_timeout (go-redis sets one deadline for each), so both are
// bounded. maxBatchBytes bounds what a batch writes, about: a burst of
// large completions goes out as several batches; a call larger than this
// goes alone. maxBatchCalls bounds what it reads: a claim's reply can be a
// whole stored record, so a batch of replays of 1 MiB responses reads up
// to 16 MiB within read_timeout. In unbounded batches, nearly every one
// of a burst of concurrent replays of large records times out, even on
// loopback.
const (
	maxBatchBytes = 256 << 10
	maxBatchCalls = 16
)

func argBytes(cmd goredis.Cmder) int {
	n := 0
	for _, a := range cmd.Args() {
		switch v := a.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		default:
			n += 8
		}
	}
	return n
}

var queuedPool = sync.Pool{New: func() any { return &queued{done: make(chan []*queued, 1)} }}

// Process sends cmd, alone or in the next batch, and returns its error.
func (b *batcher) Process(ctx context.Context, cmd goredis.Cmder) error {
	if err := ctx.Err(); err != nil {
		// As go-redis would answer it, without queueing a call nobody waits for.
		cmd.SetErr(err)
		return err
	}
	l := b.lane(ctx, cmd)
	l.mu.Lock()
	if l.onWire == 0 {
		l.onWire = 1
		l.mu.Unlock()
		// Deferred, so that a panic in a hook cannot leave the lane taken.
		defer l.handOver()
		return b.client.Process(ctx, cmd)
	}
	q := queuedPool.Get().(*queued)
	q.ctx, q.cmd, q.size = ctx, cmd, argBytes(cmd)
	l.queue = append(l.queue, q)
	l.queued += q.size
	if len(l.queue) >= maxBatchCalls || l.queued >= maxBatchBytes {
		// A full batch would gain nothing by waiting for the wire: it
		// goes now, on a wire of its own. Without this, one wire caps
		// a node at maxBatchCalls calls a round trip, and over a slow
		// round trip many clients run slower than unpipelined.
		l.onWire++
		l.sendFirst()
	}
	l.mu.Unlock()
	var batch []*queued
	select {
	case batch = <-q.done:
	case <-ctx.Done():
		if l.withdraw(q) {
			// Never sent: the caller that left runs nothing on it.
			cmd.SetErr(ctx.Err())
		} else {
			batch = <-q.done // taken into a batch already: its arguments are on their way
		}
	}
	if batch != nil {
		b.send(l, batch)
	}
	q.ctx, q.cmd = nil, nil
	queuedPool.Put(q)
	return cmd.Err()
}

// withdraw takes q out of the queue, unless a batch has taken it.
func (l *lane) withdraw(q *queued) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.Index(l.queue, q)
	if i < 0 {
		return false
	}
	l.queue = slices.Delete(l.queue, i, i+1)
	l.queued -= q.size
	return true
}

// handOver gives the wire to the first queued call, with the queue (up to
// maxBatchCalls and maxBatchBytes) as its batch, or frees it.
func (l *lane) handOver() {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.onWire--
	} else {
		l.sendFirst()
	}
	l.mu.Unlock()
}

// sendFirst takes the first batch off the queue (up to maxBatchCalls and
// maxBatchBytes) and gives it to its first call to send. l.mu is held.
func (l *lane) sendFirst() {
	queue := l.queue
	n, size := 1, queue[0].size
	for n < len(queue) && n < maxBatchCalls && size+queue[n].size <= maxBatchBytes {
		size += queue[n].size
		n++
	}
	l.queue = append(make([]*queued, 0, cap(queue)), queue[n:]...)
	l.queued -= size
	queue[0].done <- queue[:n] // buffered: never blocks
}

// send runs batch as one pipeline, wakes its calls and hands the wire on.
// The sender is one of the calls, so that each goroutine does its own
// share of the sending.
func (b *batcher) send(l *lane, batch []*queued) {
	defer func() {
		l.handOver()
		for _, q := range batch[1:] {
			q.done <- nil
		}
	}()
	ctx, cancel := batchContext(batch)
	defer cancel()
	pipe := b.client.Pipeline()
	for _, q := range batch {
		_ = pipe.Process(ctx, q.cmd)
	}
	_, _ = pipe.Exec(ctx)
}

// batchContext bounds a batch by the latest deadline among its calls, so
// that none is cut shorter than its own deadline would; with a call that
// has none, the batch has none either, and only the client's timeouts
// bound it. Cancellation does not reach the batch: one caller leaving
// must not fail the calls of others.
func batchContext(batch []*queued) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range batch {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].ctx), noCancel
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}

// The scripts run through the batcher too: go-redis's Script.Run sends
// EVALSHA through these, then EVAL when Redis does not know the script.

func (b *batcher) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return b.eval(ctx, "eval", script, keys, args)
}

func (b *batcher) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return b.eval(ctx, "evalsha", sha1, keys, args)
}

func (b *batcher) EvalRO(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return b.eval(ctx, "eval_ro", script, keys, args)
}

func (b *batcher) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return b.eval(ctx, "evalsha_ro", sha1, keys, args)
}

func (b *batcher) ScriptExists(ctx context.Context, hashes ...string) *goredis.BoolSliceCmd {
	return b.client.ScriptExists(ctx, hashes...)
}

func (b *batcher) ScriptLoad(ctx context.Context, script string) *goredis.StringCmd {
	return b.client.ScriptLoad(ctx, script)
}

// eval builds the command as go-redis's own Eval does, keys placed where a
// Cluster looks for the slot.
func (b *batcher) eval(ctx context.Context, name, payload string, keys []string, args []any) *goredis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, payload, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := goredis.NewCmd(ctx, append(cmdArgs, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = b.Process(ctx, cmd)
	return cmd
}

var _ goredis.Scripter = (*batcher)(nil)
