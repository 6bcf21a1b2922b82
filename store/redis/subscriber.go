package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/tier"
)

// Instances hear from each other through one Pub/Sub subscription per
// shared client, to the events channel of every key prefix that the
// client's stores use (eventsChannel). On a Cluster it is a sharded
// subscription (SSUBSCRIBE, and SPUBLISH to it), unless the server does not
// know those commands; then plain Pub/Sub, which a Cluster broadcasts to
// every node.
//
// The subscription starts when it is first needed: when a store with a
// local_cache joins, or when a duplicate first waits. go-redis would
// re-establish a dropped subscription silently, and a purge announced
// meanwhile would never reach this instance's local tier; so the
// subscriber sees every drop itself (a receive error, an unanswered ping,
// the server unsubscribing it when a slot moves), suspends the tiers it
// feeds until it has subscribed again, and counts the loss; what it shares
// with the PostgreSQL store's listener is in store.KeepSubscribed,
// store.LossCounter and tier.Tiers.

// subscriber is the subscription of one shared client, and the local tiers
// that it keeps coherent.
type subscriber struct {
	client goredis.UniversalClient
	losses *store.LossCounter // against the stores it serves
	logger *zap.Logger

	// sharded is set on a Cluster until the server refuses SSUBSCRIBE or
	// SPUBLISH.
	sharded atomic.Bool

	mu sync.Mutex
	// channels are never dropped: a client serves few prefixes, and
	// unsubscribing would race with a store that joins again. A channel's
	// tiers are live while it is subscribed on the current connection.
	channels map[string]*tier.Tiers
	ps       *goredis.PubSub // of the session under way, if any
	started  bool
	stopped  bool
	stop     chan struct{}
	done     chan struct{}
}

func newSubscriber(client goredis.UniversalClient, cluster bool, losses *prometheus.CounterVec, logger *zap.Logger) *subscriber {
	sub := &subscriber{
		client:   client,
		losses:   store.NewLossCounter(losses),
		logger:   logger,
		channels: make(map[string]*tier.Tiers),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	sub.sharded.Store(cluster)
	return sub
}

// join adds the store storeName of the prefix whose channel is name, and
// returns the local tier of cacheSize bytes it is to use (nil for none),
// starting the subscription that keeps the tier coherent. A lost
// subscription counts against every store joined.
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

// listening reports whether the channel name is subscribed on a live
// connection, starting the subscription if it was not.
func (sub *subscriber) listening(name string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	sub.startLocked()
	ts := sub.channels[name]
	return ts != nil && ts.Live()
}

// channel returns the channel called name, subscribing to it on the
// current connection if it is new. sub.mu is held.
func (sub *subscriber) channel(name string) *tier.Tiers {
	ts := sub.channels[name]
	if ts != nil {
		return ts
	}
	ts = new(tier.Tiers)
	sub.channels[name] = ts
	if sub.ps != nil {
		// A failure shows in the session's receive loop, which then
		// subscribes anew to every channel.
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
			// The channel's slot may have moved: ask for the slots anew
			// rather than subscribe on the old node until go-redis's
			// periodic refresh.
			cc.ReloadState(context.Background())
		}
		return lost
	})
}

// session subscribes on a new connection and delivers what it receives
// until the connection fails. It reports whether any channel was live.
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
	names := make([]string, 0, len(sub.channels))
	for name := range sub.channels {
		names = append(names, name)
	}
	sub.mu.Unlock()
	if err := sub.subscribe(ctx, ps, names...); err != nil {
		return false, err
	}

	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, store.PingAfter)
		var netErr net.Error
		switch {
		case errors.As(err, &netErr) && netErr.Timeout() && !pinged:
			pinged = true
			if err := ps.Ping(ctx); err != nil {
				return wasLive, err
			}
			continue
		case err != nil:
			if sub.refused(err, wasLive) {
				sub.logger.Info("the Redis Cluster refuses sharded Pub/Sub; using plain Pub/Sub", zap.Error(err))
			}
			return wasLive, err
		}
		pinged = false
		switch m := msg.(type) {
		case *goredis.Message:
			sub.deliver(m.Channel, m.Payload)
		case *goredis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				wasLive = sub.confirm(m.Channel) || wasLive
			case "unsubscribe", "sunsubscribe":
				// Never asked for: the server dropped the channel (its
				// slot moved to another node).
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

// refused switches to plain Pub/Sub if err is the server's refusal of
// sharded Pub/Sub, and reports whether it did.
func (sub *subscriber) refused(err error, wasLive bool) bool {
	var reply goredis.Error
	if wasLive || !sub.sharded.Load() || !errors.As(err, &reply) || !unknownCommand(reply) {
		return false
	}
	sub.sharded.Store(false)
	return true
}

func unknownCommand(err goredis.Error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// confirm marks name live and resumes its tiers, and reports whether it is
// a channel of this subscriber.
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

// deliver acts on one event: it evicts a purged record from the channel's
// tiers, then wakes the key's waiters in this process.
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

// lost ends a session: no channel is live any more, and every tier is
// suspended until its channel is subscribed again. A session that was live
// counts as a lost subscription; it reports whether it was.
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

// publish sends payload on the channel name.
func (sub *subscriber) publish(ctx context.Context, name string, payload []byte) error {
	if sub.sharded.Load() {
		err := sub.client.SPublish(ctx, name, payload).Err()
		var reply goredis.Error
		if !errors.As(err, &reply) || !unknownCommand(reply) {
			return err
		}
		sub.sharded.Store(false)
	}
	return sub.client.Publish(ctx, name, payload).Err()
}
