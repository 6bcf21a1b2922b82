package store

import (
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The instances of a shared store hear from each other (ends of awaited
// claims, purges) over one subscription per client or pool: Redis Pub/Sub,
// PostgreSQL LISTEN. What both have in common lives here.
const (
	// PingAfter is how long a silent subscription goes before it is
	// pinged; unanswered for as long again, it counts as lost, so that a
	// connection that died without a word (a partition) is noticed.
	PingAfter = time.Second
	// resubscribeMin and resubscribeMax bound the backoff.
	resubscribeMin = 100 * time.Millisecond
	resubscribeMax = 5 * time.Second
)

// KeepSubscribed runs session over and over until stop is closed, with a
// backoff of 100ms doubling up to 5s, which a session that was established
// starts over: a server that refuses it is not hammered.
func KeepSubscribed(stop <-chan struct{}, session func() (established bool)) {
	backoff := resubscribeMin
	for {
		if session() {
			backoff = resubscribeMin
		}
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, resubscribeMax)
	}
}

// LossCounter counts the losses of one subscription in
// SubscriptionLosses, once against each store it serves.
type LossCounter struct {
	losses *prometheus.CounterVec
	mu     sync.Mutex
	stores map[string]int // the names of the stores served, and how many of each
}

// NewLossCounter returns a counter that counts in losses, from
// SubscriptionLosses.
func NewLossCounter(losses *prometheus.CounterVec) *LossCounter {
	return &LossCounter{losses: losses, stores: make(map[string]int)}
}

// Add adds the store called name to those the subscription serves; a
// reload adds the same name twice, and removes it once.
func (c *LossCounter) Add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stores[name]++
}

// Remove undoes Add.
func (c *LossCounter) Remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stores[name]--; c.stores[name] <= 0 {
		delete(c.stores, name)
	}
}

// Lost counts one loss against every store served.
func (c *LossCounter) Lost() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.stores {
		c.losses.WithLabelValues(name).Inc()
	}
}

// The events that instances announce on their channel, as text: one byte
// of kind, then the key's 64 hex digits (PostgreSQL composes them in SQL).
const (
	EventEnded  = 'e' // a claim someone waits for was completed or released
	EventPurged = 'p' // a record was deleted, whatever its state
	eventLen    = 1 + 2*len(Key{})
)

// AppendEvent appends the event of kind about k to dst.
func AppendEvent(dst []byte, kind byte, k Key) []byte {
	dst = append(dst, kind)
	return hex.AppendEncode(dst, k[:])
}

// ParseEvent reads what AppendEvent wrote; ok is false for anything else.
func ParseEvent(p string) (kind byte, k Key, ok bool) {
	if len(p) != eventLen || (p[0] != EventEnded && p[0] != EventPurged) {
		return 0, k, false
	}
	if _, err := hex.Decode(k[:], []byte(p[1:])); err != nil {
		return 0, k, false
	}
	return p[0], k, true
}

// subscriptionLosses is process-wide, like the subscriptions, and
// registered into each config's registry.
var subscriptionLosses = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "idempotency", Name: "store_subscription_losses_total",
	Help: "Subscriptions to other instances' notifications (wake-ups of waiting duplicates, purges) that dropped and had to be re-established, by store.",
}, []string{"store"})

// SubscriptionLosses registers the loss counter, labelled by store name,
// into reg (unless nil), tolerating an earlier config's registration, and
// returns it.
func SubscriptionLosses(reg *prometheus.Registry) (*prometheus.CounterVec, error) {
	if reg != nil {
		if err := reg.Register(subscriptionLosses); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, err
		}
	}
	return subscriptionLosses, nil
}
