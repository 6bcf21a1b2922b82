package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/tier"
)

// listener LISTENs to the table's channel on a connection of its own: it
// wakes this process's waiters and evicts purged records from the tiers.
// It starts when first needed (a local_cache, a waiting duplicate). A
// failed connection is a lost subscription: the tiers are suspended until
// a new connection has LISTENed again.
type listener struct {
	cfg    *pgx.ConnConfig
	listen string // the LISTEN statement
	tiers  tier.Tiers
	losses *store.LossCounter
	logger *zap.Logger

	ctx    context.Context // ends the session under way when the listener closes
	cancel context.CancelFunc

	mu      sync.Mutex
	started bool
	stopped bool
	stop    chan struct{}
	done    chan struct{}
}

func newListener(cfg *pgx.ConnConfig, channel string, losses *prometheus.CounterVec, logger *zap.Logger) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{
		cfg:    cfg,
		listen: listenStatement(channel),
		losses: store.NewLossCounter(losses),
		logger: logger,
		ctx:    ctx,
		cancel: cancel,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// join adds the store storeName, and returns its local tier of cacheSize
// bytes (nil for none), starting the listener for a tier.
func (l *listener) join(cacheSize int64, storeName string) *tier.Cache {
	l.losses.Add(storeName)
	c := l.tiers.Join(cacheSize)
	if c != nil {
		l.start()
	}
	return c
}

// leave undoes join.
func (l *listener) leave(cacheSize int64, storeName string) {
	l.losses.Remove(storeName)
	l.tiers.Leave(cacheSize)
}

// listening reports whether the channel is listened to on a live
// connection, starting the listener if it was not.
func (l *listener) listening() bool {
	l.start()
	return l.tiers.Live()
}

func (l *listener) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return
	}
	l.started = true
	go l.run()
}

// close ends the listener; the pool's last user calls it.
func (l *listener) close() {
	l.mu.Lock()
	l.stopped = true
	started := l.started
	close(l.stop)
	l.mu.Unlock()
	l.cancel()
	if started {
		<-l.done
	}
}

func (l *listener) run() {
	defer close(l.done)
	store.KeepSubscribed(l.stop, func() bool {
		wasLive, err := l.session()
		return l.lost(err, wasLive)
	})
}

// session connects, LISTENs and delivers what it receives until the
// connection fails or the listener closes. wasLive is whether it LISTENed.
func (l *listener) session() (wasLive bool, err error) {
	ctx := l.ctx
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return false, err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	listenCtx, cancel := context.WithTimeout(ctx, callTimeout)
	_, err = conn.PgConn().Exec(listenCtx, l.listen).ReadAll()
	cancel()
	if err != nil {
		return false, err
	}
	// LISTEN has committed: a tier that takes records from now on hears of
	// their purges.
	l.tiers.Resume()
	for {
		waitCtx, cancel := context.WithTimeout(ctx, store.PingAfter)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			l.deliver(n.Payload)
			continue
		case ctx.Err() != nil:
			return true, nil
		case !pgconn.Timeout(err):
			return true, err
		}
		// Silent: a connection that died without a word fails the ping.
		pingCtx, cancel := context.WithTimeout(ctx, store.PingAfter)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return true, err
		}
	}
}

// deliver evicts a purged record from the tiers, then wakes the key's
// waiters.
func (l *listener) deliver(payload string) {
	kind, key, ok := store.ParseEvent(payload)
	if !ok {
		return
	}
	if kind == store.EventPurged {
		l.tiers.Evict(key)
	}
	store.SignalEnd(key)
}

// lost ends a session, suspending the tiers until the next one LISTENs,
// and reports whether it was live: then it counts as a lost subscription.
func (l *listener) lost(err error, wasLive bool) bool {
	l.tiers.Suspend()
	l.mu.Lock()
	stopped := l.stopped
	l.mu.Unlock()
	if !wasLive || stopped {
		return false
	}
	l.losses.Lost()
	l.logger.Warn("lost the PostgreSQL connection that LISTENs for the ends of claims that duplicates wait for and for purges; local cache off until it is back",
		zap.Error(err))
	return true
}
