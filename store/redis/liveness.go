package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// liveness checks that a session's subscription still hears, after each
// silence of store.PingAfter: it pings the subscription, or on a Sentinel
// client publishes a probe to one of its channels, which must come back
// within as long again.
//
// A ping proves only that the node answers. After a failover that leaves
// the old master running, go-redis moves the client's commands to the new
// master but not its Pub/Sub connection (its failover hook filters the
// command pools alone), so the subscription can sit on a node that no
// longer hears the master's PUBLISH, its tiers trusted while purges go
// unheard. A probe goes where the client publishes purges: heard, the
// subscription hears them too, on the master or on a replica of it.
type liveness struct {
	ps      *goredis.PubSub
	client  goredis.UniversalClient
	channel string // where probes go; "" to ping
	probe   string // the payload, this subscriber's own, never an event
	sent    time.Time
}

// newProbe is a subscriber's probe payload, which store.ParseEvent rejects.
func newProbe() string {
	var id [8]byte
	rand.Read(id[:])
	return "probe " + hex.EncodeToString(id[:])
}

// timeout is how long the session may wait for its next message: until the
// check under way is due, or for a silence.
func (l *liveness) timeout() time.Duration {
	if l.sent.IsZero() {
		return store.PingAfter
	}
	return max(time.Until(l.sent.Add(store.PingAfter)), time.Millisecond)
}

// expired starts a check, or fails the one under way.
func (l *liveness) expired(ctx context.Context) error {
	switch {
	case !l.sent.IsZero() && l.channel != "":
		return errors.New("the subscription did not hear its probe, published to the master: it is on a node that no longer hears the master")
	case !l.sent.IsZero():
		return errors.New("the subscription did not answer its ping")
	}
	l.sent = time.Now()
	if l.channel == "" {
		return l.ps.Ping(ctx)
	}
	return l.client.Publish(ctx, l.channel, l.probe).Err()
}

// answered ends the check that msg answers, and tells whether msg was only
// that answer, with nothing to deliver. Any message answers a ping; only
// its own probe answers a probe.
func (l *liveness) answered(msg any) bool {
	m, isMessage := msg.(*goredis.Message)
	switch {
	case l.channel == "":
		l.sent = time.Time{}
		_, pong := msg.(*goredis.Pong)
		return pong
	case isMessage && m.Payload == l.probe:
		l.sent = time.Time{}
		return true
	}
	return false
}
