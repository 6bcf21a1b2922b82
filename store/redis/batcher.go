package redis

import (
	"context"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// batcher pipelines store calls: one that finds the wire idle goes alone;
// those arriving meanwhile go as one pipeline when it frees, or at once on
// another connection once they fill a batch. A queued call whose caller
// leaves is withdrawn; a batched one waits, as the batch may be writing its
// arguments, which the store reuses after the call. On a Cluster each
// master has a lane, so a slow node delays only its slots.
type batcher struct {
	goredis.Scripter // the client, for ScriptExists and ScriptLoad
	client           goredis.UniversalClient
	cluster          *goredis.ClusterClient // nil: one lane for all
	single           lane
	lanes            sync.Map // *goredis.Client of a master → *lane
}

// lane is one node's calls: a call or batch on the wire, plus one per full batch.
type lane struct {
	mu     sync.Mutex
	onWire int // calls or batches being sent and read
	queue  []*queued
	queued int // the queue's size, about, in bytes of arguments
}

func newBatcher(life context.Context, client goredis.UniversalClient) *batcher {
	cluster, _ := client.(*goredis.ClusterClient)
	b := &batcher{Scripter: client, client: client, cluster: cluster}
	if cluster != nil {
		go b.pruneLanes(life)
	}
	return b
}

// lanePruneInterval is how often a Cluster's lanes are checked against its
// masters; tests shorten it.
var lanePruneInterval = time.Minute

// pruneLanes drops the lanes of nodes that are no longer masters (resharded
// away, removed, replaced), until life ends: go-redis closes such a node's
// client and gives a node that comes back a new one, so their lanes would
// pile up in a long-running Caddy. A call that still holds a dropped lane
// finishes on it, and a master dropped by mistake gets a new lane.
func (b *batcher) pruneLanes(life context.Context) {
	tick := time.NewTicker(lanePruneInterval)
	defer tick.Stop()
	for {
		select {
		case <-life.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(life, lanePruneInterval)
		var mu sync.Mutex
		masters := make(map[*goredis.Client]bool)
		err := b.cluster.ForEachMaster(ctx, func(_ context.Context, c *goredis.Client) error {
			mu.Lock()
			masters[c] = true
			mu.Unlock()
			return nil
		})
		cancel()
		if err != nil {
			continue // no slot map: nothing to go by
		}
		b.lanes.Range(func(master, _ any) bool {
			if !masters[master.(*goredis.Client)] {
				b.lanes.Delete(master)
			}
			return true
		})
	}
}

// lane is the lane of cmd's master, or, if unknown, the shared one.
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

// commandKey is the key of a SET or GET, or a script's first key.
func commandKey(cmd goredis.Cmder) (string, bool) {
	args := cmd.Args()
	pos := 3
	if len(args) > 0 && (args[0] == "set" || args[0] == "get") {
		pos = 1
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

// go-redis gives a batch one write and one read deadline: maxBatchBytes
// bounds what it writes, maxBatchCalls what it reads (a reply can be a record).
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
		// Full: waiting would gain nothing, so it goes on a wire of its own.
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

// handOver gives the wire to the first queued call, with a batch, or frees it.
func (l *lane) handOver() {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.onWire--
	} else {
		l.sendFirst()
	}
	l.mu.Unlock()
}

// sendFirst gives the queue's first batch to its first call. l.mu is held.
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

// batchContext bounds a batch by its calls' latest deadline, if all have
// one; a caller leaving must not cancel the others' calls.
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

// Eval and its kin run scripts through the batcher (Script.Run: EVALSHA, then EVAL).
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

// eval builds the command as go-redis's Eval does, the first key marking the slot.
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
