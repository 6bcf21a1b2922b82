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

// min_replicas: WAIT counts the replicas having its own connection's writes
// and cannot run in a script, so each WAIT follows its write in one pipeline,
// which goes on one connection.

const defaultReplicaTimeout = 100 * time.Millisecond

// retryCompletions bounds the completions awaiting resend; more are abandoned.
const retryCompletions = 1024

// replicaShortfalls is process-wide, registered into each config's registry.
var replicaShortfalls = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "idempotency", Name: "store_replica_shortfalls_total",
	Help: "Redis writes that fewer replicas than min_replicas acknowledged within replica_timeout, by store and write: claim (withdrawn; the request answered per on_store_error), completion (kept on the master and sent again), completion_abandoned (the lease passed first), unknown_outcome (a dead owner's claim turned into its unknown outcome, kept).",
}, []string{"store", "write"})

// errTooFewReplicas fails claims (wrapped in store.ErrUnavailable) and
// provisioning short of replicas.
var errTooFewReplicas = errors.New("too few replicas")

// replication waits for min_replicas after each write, resending missed completions.
type replication struct {
	want    int
	timeout time.Duration
	client  goredis.UniversalClient
	// The replicaShortfalls of this store, by write.
	shortClaims, shortCompletions, abandoned, shortUnknown prometheus.Counter
	logger                                                 *zap.Logger
	retries                                                chan resend
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
		shortUnknown:     replicaShortfalls.WithLabelValues(name, "unknown_outcome"),
		retries:          make(chan resend, retryCompletions),
	}
	go r.run(ctx)
	return r, nil
}

// check asks every master whether it accepts WAIT and has the replicas; one
// that does not answer is checked by the first claim's WAIT instead.
func (r *replication) check(ctx context.Context) (reachable bool, err error) {
	ask := func(ctx context.Context, c *goredis.Client) error {
		if err := c.Do(ctx, "wait", 0, 0).Err(); err != nil {
			return err
		}
		// So that a completion's EVALSHA does not cost a NOSCRIPT and a retry.
		if err := completeScript.Load(ctx, c).Err(); err != nil {
			return err
		}
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		// Any state counts: a syncing replica is online soon, claims fail until then.
		if n := connectedReplicas(info); n < r.want {
			where := "the master"
			if _, ok := r.client.(*goredis.ClusterClient); ok {
				where += " at " + c.Options().Addr
			}
			return fmt.Errorf("%w: %s has %d, min_replicas wants %d", errTooFewReplicas, where, n, r.want)
		}
		return nil
	}
	err = forEachMaster(ctx, r.client, ask)
	var refused goredis.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &refused) || errors.Is(err, errTooFewReplicas):
		return true, fmt.Errorf("checking min_replicas %d (the server must accept WAIT and have the replicas): %w", r.want, err)
	}
	return false, err
}

// connectedReplicas reads connected_slaves from INFO replication, or -1.
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

func (r *replication) master(ctx context.Context, key string) (*goredis.Client, error) {
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return r.client.(*goredis.Client), nil
}

// onMaster runs what queue adds and a WAIT as one pipeline on key's master
// (the node itself: a Cluster client would send a keyless WAIT to any node);
// it tries again if queue's write is answered MOVED (reloading slots), ASK or
// NOSCRIPT (then with eval).
func (r *replication) onMaster(ctx context.Context, key string, queue func(p goredis.Pipeliner, eval bool) goredis.Cmder) (write goredis.Cmder, wait *goredis.IntCmd, err error) {
	node, err := r.master(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	var asking, eval bool
	for attempt := 0; ; attempt++ {
		_, _ = node.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if asking {
				p.Do(ctx, "asking")
			}
			write = queue(p, eval)
			wait = r.queueWait(ctx, p)
			return nil
		})
		err := write.Err()
		ask, addr, redirected := redirect(err)
		noScript := err != nil && !eval && goredis.HasErrorPrefix(err, "NOSCRIPT")
		if attempt == 2 || (!redirected && !noScript) {
			return write, wait, nil
		}
		switch {
		case noScript:
			eval = true
		case ask:
			node, asking = r.node(ctx, addr), true
		default:
			cc := r.client.(*goredis.ClusterClient)
			cc.ReloadState(ctx)
			if node, err = cc.MasterForKey(ctx, key); err != nil {
				return nil, nil, err
			}
			asking = false
		}
		if node == nil {
			return nil, nil, fmt.Errorf("no cluster master at %s", addr)
		}
	}
}

// evalScript queues script on p: EVALSHA, or EVAL after a NOSCRIPT.
func evalScript(ctx context.Context, p goredis.Pipeliner, script *goredis.Script, eval bool, keys []string, args ...any) *goredis.Cmd {
	if eval {
		return script.Eval(ctx, p, keys, args...)
	}
	return script.EvalSha(ctx, p, keys, args...)
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

// claimed reads the WAIT that followed a claim on its connection, and
// withdraws the claim and fails if fewer replicas than min_replicas have it.
func (r *replication) claimed(wrote bool, wait *goredis.IntCmd, release func() error) error {
	n, err := wait.Result()
	switch {
	case !wrote:
		err = errors.New("the claim's reply was lost, so no WAIT counted it")
	case err != nil:
		err = fmt.Errorf("waiting for min_replicas (the server must accept WAIT): %w", err)
	case int(n) < r.want:
		r.shortClaims.Inc()
		err = fmt.Errorf("%w: %d of %d acknowledged the claim within %v", errTooFewReplicas, n, r.want, r.timeout)
	default:
		return nil
	}
	if rerr := release(); rerr != nil {
		r.logger.Warn("withdrawing a claim the replicas did not acknowledge", zap.Error(rerr))
	}
	return err
}

// unknownKept reads the WAIT that followed a dead claim's conversion into
// its unknown outcome (Claim.KeepUnknown), unless wrote, in a pipeline that
// a retry's first try wrote. Too few replicas are counted and logged, but
// the record stands and is answered: it runs nothing, and a failover that
// loses it brings back the dead claim (the replicas had it: a claim waits
// for them), which the next retry turns again. Failing instead would
// answer on_store_error: with fail_open, running the request a second time.
func (r *replication) unknownKept(wrote bool, wait *goredis.IntCmd) {
	n, err := wait.Result()
	if wrote && err == nil && int(n) >= r.want {
		return
	}
	r.shortUnknown.Inc()
	r.logger.Warn("too few replicas acknowledged a dead owner's claim turned into its unknown outcome; kept, as a failover that loses it brings the dead claim back, for the next retry to turn again",
		zap.Int64("acknowledged", n), zap.Int("min_replicas", r.want), zap.Error(err))
}

// short tells whether a completion's WAIT found too few replicas.
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

// queueWait adds a WAIT to p, read within read_timeout (> replica_timeout).
func (r *replication) queueWait(ctx context.Context, p goredis.Pipeliner) *goredis.IntCmd {
	cmd := goredis.NewIntCmd(ctx, "wait", r.want, millis(r.timeout))
	_ = p.Process(ctx, cmd)
	return cmd
}
