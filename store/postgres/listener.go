package postgres

import (
	"context"
	"sync"

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
	once   sync.Once // starts run, or closes done if close comes first
	done   chan struct{}
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

func (l *listener) start() { l.once.Do(func() { go l.run() }) }

// close ends the listener; the pool's last user calls it.
func (l *listener) close() {
	l.cancel()
	l.once.Do(func() { close(l.done) })
	<-l.done
}

// run keeps a session going until close.
func (l *listener) run() {
	defer close(l.done)
	store.KeepSubscribed(l.ctx.Done(), func() bool {
		wasLive, err := l.session()
		l.tiers.Suspend()
		if !wasLive || l.ctx.Err() != nil {
			return false
		}
		l.losses.Lost()
		l.logger.Warn("lost the PostgreSQL connection that LISTENs for the ends of claims that duplicates wait for and for purges; local cache off until it is back",
			zap.Error(err))
		return true
	})
}

// session connects, LISTENs and delivers what it receives until the
// connection fails or the listener closes. wasLive is whether it LISTENed.
func (l *listener) session() (wasLive bool, err error) {
	conn, err := pgx.ConnectConfig(l.ctx, l.cfg)
	if err != nil {
		return false, err
	}
	defer closeConn(conn)
	listenCtx, cancel := context.WithTimeout(l.ctx, callTimeout)
	_, err = conn.PgConn().Exec(listenCtx, l.listen).ReadAll()
	cancel()
	if err != nil {
		return false, err
	}
	// LISTEN has committed: a tier that takes records from now on hears of
	// their purges.
	l.tiers.Resume()
	for {
		waitCtx, cancel := context.WithTimeout(l.ctx, store.PingAfter)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			// A purged record leaves the tiers before its waiters wake.
			if kind, key, ok := store.ParseEvent(n.Payload); ok {
				if kind == store.EventPurged {
					l.tiers.Evict(key)
				}
				store.SignalEnd(key)
			}
			continue
		case l.ctx.Err() != nil:
			return true, nil
		case !pgconn.Timeout(err):
			return true, err
		}
		// Silent: a connection that died without a word fails the ping.
		pingCtx, cancel := context.WithTimeout(l.ctx, store.PingAfter)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return true, err
		}
	}
}
