package redis

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/tier"
)

// subscriber is a shared client's subscription to its prefixes' channels,
// sharded on a Cluster unless refused, started when first needed. go-redis
// would resubscribe silently after a drop, losing the purges meanwhile; so
// the subscriber sees every drop itself, suspends the local tiers it keeps
// coherent until subscribed again, and counts the loss.
type subscriber struct {
	client goredis.UniversalClient
	losses *store.LossCounter // against the stores it serves
	logger *zap.Logger

	// sharded is set on a Cluster until the server refuses SSUBSCRIBE or SPUBLISH.
	sharded atomic.Bool
	probe   string // on a Sentinel client, its probe's payload (liveness)

	mu sync.Mutex
	// channels are never dropped: a client serves few prefixes, and
	// unsubscribing would race with a store that joins again.
	channels map[string]*tier.Tiers
	ps       *goredis.PubSub // of the session under way, if any
	started  bool
	stopped  bool
	stop     chan struct{}
	done     chan struct{}
}

func newSubscriber(client goredis.UniversalClient, cluster, sentinel bool, losses *prometheus.CounterVec, logger *zap.Logger) *subscriber {
	sub := &subscriber{
		client:   client,
		losses:   store.NewLossCounter(losses),
		logger:   logger,
		channels: make(map[string]*tier.Tiers),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	sub.sharded.Store(cluster)
	if sentinel {
		sub.probe = newProbe()
	}
	return sub
}

// join adds storeName on channel name, where lost subscriptions count against
// it, and returns its tier, nil for none.
func (sub *subscriber) join(name string, cacheSize int64, storeName string) *tier.Cache {
	sub.losses.Add(storeName)
	sub.mu.Lock()
	defer sub.mu.Unlock()
	c := sub.channel(name).Join(cacheSize)
	if c != nil {
		sub.startLocked()
	}
	return c
}

// leave undoes join.
func (sub *subscriber) leave(name string, cacheSize int64, storeName string) {
	sub.losses.Remove(storeName)
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if ts := sub.channels[name]; ts != nil {
		ts.Leave(cacheSize)
	}
}

// listening reports whether channel name is live, starting the subscription.
func (sub *subscriber) listening(name string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.startLocked()
	ts := sub.channels[name]
	return ts != nil && ts.Live()
}

// channel returns channel name, subscribing to it if new. sub.mu is held.
func (sub *subscriber) channel(name string) *tier.Tiers {
	if ts := sub.channels[name]; ts != nil {
		return ts
	}
	ts := new(tier.Tiers)
	sub.channels[name] = ts
	if sub.ps != nil {
		// A failure shows in the receive loop; the next session subscribes anew.
		_ = sub.subscribe(context.Background(), sub.ps, name)
	}
	return ts
}

func (sub *subscriber) startLocked() {
	if sub.started || sub.stopped {
		return
	}
	sub.started = true
	go sub.run()
}

// close ends the subscription; the client's last user calls it.
func (sub *subscriber) close() {
	sub.mu.Lock()
	sub.stopped = true
	started := sub.started
	if sub.ps != nil {
		_ = sub.ps.Close()
	}
	close(sub.stop)
	sub.mu.Unlock()
	if started {
		<-sub.done
	}
}

func (sub *subscriber) run() {
	defer close(sub.done)
	store.KeepSubscribed(sub.stop, func() bool {
		wasLive, err := sub.session()
		lost := sub.lost(err, wasLive)
		if cc, ok := sub.client.(*goredis.ClusterClient); ok {
			// The slot may have moved: reload, not wait for go-redis's refresh.
			cc.ReloadState(context.Background())
		}
		return lost
	})
}

// session subscribes on a new connection and delivers until it fails.
func (sub *subscriber) session() (wasLive bool, err error) {
	ctx := context.Background()
	var ps *goredis.PubSub
	if sub.sharded.Load() {
		ps = sub.client.SSubscribe(ctx)
	} else {
		ps = sub.client.Subscribe(ctx)
	}
	defer ps.Close()

	sub.mu.Lock()
	if sub.stopped {
		sub.mu.Unlock()
		return false, nil
	}
	sub.ps = ps
	names := slices.Collect(maps.Keys(sub.channels))
	sub.mu.Unlock()
	if err := sub.subscribe(ctx, ps, names...); err != nil {
		return false, err
	}

	live := liveness{ps: ps, client: sub.client, probe: sub.probe}
	if sub.probe != "" && len(names) > 0 {
		live.channel = names[0]
	}
	for {
		msg, err := ps.ReceiveTimeout(ctx, live.timeout())
		var netErr net.Error
		switch {
		case errors.As(err, &netErr) && netErr.Timeout():
			if err := live.expired(ctx); err != nil {
				return wasLive, err
			}
			continue
		case err != nil:
			if sub.refused(err, wasLive) {
				sub.logger.Info("the Redis Cluster refuses sharded Pub/Sub; using plain Pub/Sub", zap.Error(err))
			}
			return wasLive, err
		case live.answered(msg):
			continue
		}
		switch m := msg.(type) {
		case *goredis.Message:
			sub.deliver(m.Channel, m.Payload)
		case *goredis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				wasLive = sub.confirm(m.Channel) || wasLive
			case "unsubscribe", "sunsubscribe":
				// Not asked for: the channel's slot moved to another node.
				return wasLive, errors.New("the server unsubscribed " + m.Channel)
			}
		}
	}
}

func (sub *subscriber) subscribe(ctx context.Context, ps *goredis.PubSub, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if sub.sharded.Load() {
		return ps.SSubscribe(ctx, names...)
	}
	return ps.Subscribe(ctx, names...)
}

// refused switches to plain Pub/Sub if err refuses sharded, reporting whether.
func (sub *subscriber) refused(err error, wasLive bool) bool {
	return !wasLive && unknownCommand(err) && sub.sharded.CompareAndSwap(true, false)
}

func unknownCommand(err error) bool {
	var reply goredis.Error
	return errors.As(err, &reply) && strings.Contains(strings.ToLower(reply.Error()), "unknown command")
}

// confirm resumes the tiers of channel name, reporting whether it is one.
func (sub *subscriber) confirm(name string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	ts := sub.channels[name]
	if ts == nil {
		return false
	}
	ts.Resume()
	return true
}

// deliver evicts a purged record from the channel's tiers and wakes its waiters.
func (sub *subscriber) deliver(name, payload string) {
	kind, key, ok := store.ParseEvent(payload)
	if !ok {
		return
	}
	if kind == store.EventPurged {
		sub.mu.Lock()
		ts := sub.channels[name]
		sub.mu.Unlock()
		if ts != nil {
			ts.Evict(key)
		}
	}
	store.SignalEnd(key)
}

// lost suspends every tier until resubscribed, and counts a session that was live.
func (sub *subscriber) lost(err error, wasLive bool) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.ps = nil
	for _, ts := range sub.channels {
		ts.Suspend()
	}
	if !wasLive || sub.stopped {
		return false
	}
	sub.losses.Lost()
	sub.logger.Warn("lost the Redis subscription that wakes waiting duplicates and keeps the local cache coherent; local cache off until it is back",
		zap.Error(err))
	return true
}

func (sub *subscriber) publish(ctx context.Context, name string, payload []byte) error {
	if sub.sharded.Load() {
		err := sub.client.SPublish(ctx, name, payload).Err()
		if !unknownCommand(err) {
			return err
		}
		sub.sharded.Store(false)
	}
	return sub.client.Publish(ctx, name, payload).Err()
}
