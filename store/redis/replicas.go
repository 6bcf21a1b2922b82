package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Claims that survive a failover (min_replicas). Redis replicates
// asynchronously, and WAIT n timeout blocks until n replicas have every
// write made so far on its own connection; it cannot run inside a script.
// So the store writes and waits on one connection of the key's master: a
// claim's SET, then WAIT only if it claimed (replays and refusals wrote
// nothing and do not wait); a completion's script and its WAIT in one
// pipeline.

const defaultReplicaTimeout = 100 * time.Millisecond

// retryCompletions bounds the completions waiting to be sent to the
// replicas again; more are counted as abandoned.
const retryCompletions = 1024

// replicaShortfalls is process-wide, like the clients, and registered into
// each config's registry.
var replicaShortfalls = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "idempotency", Name: "store_replica_shortfalls_total",
	Help: "Redis writes that fewer replicas than min_replicas acknowledged within replica_timeout, by store and write: claim (withdrawn; the request answered per on_store_error), completion (kept on the master and sent again), completion_abandoned (the lease passed first).",
}, []string{"store", "write"})

// errTooFewReplicas is what a claim that too few replicas acknowledged
// fails with (wrapped in store.ErrUnavailable), and a server with too few
// replicas at provisioning.
var errTooFewReplicas = errors.New("too few replicas")

// replication waits for min_replicas replicas after each claim and
// completion, and sends again the completions they missed.
type replication struct {
	want    int
	timeout time.Duration
	client  goredis.UniversalClient
	// The replicaShortfalls of this store, by write.
	shortClaims, shortCompletions, abandoned prometheus.Counter
	logger                                   *zap.Logger
	retries                                  chan resend
}

func newReplication(ctx context.Context, want int, timeout time.Duration, client goredis.UniversalClient, name string, reg *prometheus.Registry, logger *zap.Logger) (*replication, error) {
	if reg != nil {
		if err := reg.Register(replicaShortfalls); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	r := &replication{
		want: want, timeout: timeout, client: client, logger: logger,
		shortClaims:      replicaShortfalls.WithLabelValues(name, "claim"),
		shortCompletions: replicaShortfalls.WithLabelValues(name, "completion"),
		abandoned:        replicaShortfalls.WithLabelValues(name, "completion_abandoned"),
		retries:          make(chan resend, retryCompletions),
	}
	go r.run(ctx)
	return r, nil
}

// check asks every master whether it accepts WAIT (WAIT 0 0 answers at
// once) and how many replicas it has (INFO replication). A server that
// answers with an error or too few replicas is a config error; one that
// does not answer is checked by the first claim instead, whose WAIT fails
// as clearly.
func (r *replication) check(ctx context.Context) (reachable bool, err error) {
	ask := func(ctx context.Context, c *goredis.Client) error {
		if err := c.Do(ctx, "wait", 0, 0).Err(); err != nil {
			return err
		}
		// Loaded now, a completion's EVALSHA finds its script: a NOSCRIPT
		// costs the pipeline a second try, and its WAIT, too.
		if err := completeScript.Load(ctx, c).Err(); err != nil {
			return err
		}
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		// Connected, in whatever state: one that is syncing now will be
		// online soon, and until then the claims wait for it and fail.
		if n := connectedReplicas(info); n < r.want {
			return fmt.Errorf("%w: %s has %d, min_replicas wants %d", errTooFewReplicas, r.describe(c), n, r.want)
		}
		return nil
	}
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, ask)
	} else {
		err = ask(ctx, r.client.(*goredis.Client))
	}
	var refused goredis.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &refused) || errors.Is(err, errTooFewReplicas):
		return true, fmt.Errorf("checking min_replicas %d (the server must accept WAIT and have the replicas): %w", r.want, err)
	}
	return false, err
}

// connectedReplicas reads connected_slaves from INFO replication; -1 if
// it is missing.
func connectedReplicas(info string) int {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// describe names the master c for an error.
func (r *replication) describe(c *goredis.Client) string {
	if _, ok := r.client.(*goredis.ClusterClient); ok {
		return "the master at " + c.Options().Addr
	}
	return "the master"
}

// master is the client of the node that serves key: the store's own on a
// single node or Sentinel, the slot's master on a Cluster.
func (r *replication) master(ctx context.Context, key string) (*goredis.Client, error) {
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return r.client.(*goredis.Client), nil
}

// onMaster runs the commands that queue adds, in one pipeline, on a
// connection of the master that serves key, and returns that connection
// for the caller to wait on and close. queue returns the write whose
// answer tells whether to try again: after a Cluster's MOVED (the slot
// moved: the client's map is reloaded) or ASK (the slot is migrating: the
// importing node is asked), or with eval set after NOSCRIPT (a master that
// lost its scripts, a new one after a failover).
func (r *replication) onMaster(ctx context.Context, key string, queue func(p goredis.Pipeliner, eval bool) goredis.Cmder) (*goredis.Conn, error) {
	node, err := r.master(ctx, key)
	if err != nil {
		return nil, err
	}
	var asking, eval bool
	for attempt := 0; ; attempt++ {
		conn := node.Conn()
		var write goredis.Cmder
		_, _ = conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if asking {
				p.Do(ctx, "asking")
			}
			write = queue(p, eval)
			return nil
		})
		err := write.Err()
		ask, addr, redirected := redirect(err)
		noScript := err != nil && !eval && goredis.HasErrorPrefix(err, "NOSCRIPT")
		if attempt == 2 || (!redirected && !noScript) {
			return conn, nil
		}
		_ = conn.Close()
		switch {
		case noScript:
			eval = true
		case ask:
			node, asking = r.node(ctx, addr), true
		default:
			cc := r.client.(*goredis.ClusterClient)
			cc.ReloadState(ctx)
			if node, err = cc.MasterForKey(ctx, key); err != nil {
				return nil, err
			}
			asking = false
		}
		if node == nil {
			return nil, fmt.Errorf("no cluster master at %s", addr)
		}
	}
}

// redirect reads a Cluster's MOVED or ASK answer.
func redirect(err error) (ask bool, addr string, ok bool) {
	var rerr goredis.Error
	if err == nil || !errors.As(err, &rerr) {
		return false, "", false
	}
	kind, rest, _ := strings.Cut(err.Error(), " ")
	if kind != "MOVED" && kind != "ASK" {
		return false, "", false
	}
	_, addr, ok = strings.Cut(rest, " ")
	return kind == "ASK", addr, ok
}

// node is the Cluster master at addr, nil if the client knows none.
func (r *replication) node(ctx context.Context, addr string) *goredis.Client {
	cc, ok := r.client.(*goredis.ClusterClient)
	if !ok {
		return nil
	}
	var mu sync.Mutex
	var found *goredis.Client
	_ = cc.ForEachMaster(ctx, func(_ context.Context, c *goredis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	return found
}

// claimed waits until the replicas have the claim that conn just wrote.
// Short of them, it withdraws the claim with release and fails: the
// request must not run on a claim that a failover could lose.
func (r *replication) claimed(ctx context.Context, conn *goredis.Conn, release func() error) error {
	n, err := conn.Wait(ctx, r.want, r.timeout).Result()
	if err == nil && int(n) >= r.want {
		return nil
	}
	if err == nil {
		r.shortClaims.Inc()
		err = fmt.Errorf("%w: %d of %d acknowledged the claim within %v", errTooFewReplicas, n, r.want, r.timeout)
	} else {
		err = fmt.Errorf("waiting for min_replicas (the server must accept WAIT): %w", err)
	}
	if rerr := release(); rerr != nil {
		r.logger.Warn("withdrawing a claim the replicas did not acknowledge", zap.Error(rerr))
	}
	return err
}

// short tells whether too few replicas acknowledged a completion, as the
// WAIT that followed it answered; the completion stays (the master has it)
// and is to be sent again.
func (r *replication) short(wait *goredis.IntCmd) bool {
	n, err := wait.Result()
	if err == nil && int(n) >= r.want {
		return false
	}
	r.shortCompletions.Inc()
	r.logger.Warn("too few replicas acknowledged a completion; sending it again while the lease lasts",
		zap.Int64("acknowledged", n), zap.Int("min_replicas", r.want), zap.Error(err))
	return true
}

// queueWait adds a WAIT to p, whose reply is read within read_timeout
// (Validate keeps replica_timeout shorter).
func (r *replication) queueWait(ctx context.Context, p goredis.Pipeliner) *goredis.IntCmd {
	cmd := goredis.NewIntCmd(ctx, "wait", r.want, millis(r.timeout))
	_ = p.Process(ctx, cmd)
	return cmd
}
