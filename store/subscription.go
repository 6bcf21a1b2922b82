package store

import (
	"encoding/hex"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The instances of a shared store hear from each other (the ends of claims
// that someone waits for, purges) over one subscription per client or
// pool: Redis Pub/Sub, PostgreSQL LISTEN. What the subscriptions of both
// have in common lives here: how a silent one is checked, the backoff
// between attempts to establish one again, and the counting of losses
// against the stores a subscription serves. The local tiers that a
// subscription keeps coherent are tier.Tiers.
const (
	// PingAfter is how long a silent subscription goes before it is
	// pinged; unanswered for as long again, it counts as lost. A
	// connection that died without a word (a partition) is noticed within
	// twice this.
	PingAfter = time.Second
	// resubscribeMin and resubscribeMax bound the backoff between attempts
	// to subscribe again.
	resubscribeMin = 100 * time.Millisecond
	resubscribeMax = 5 * time.Second
)

// KeepSubscribed runs session over and over until stop is closed, waiting
// between two runs with a backoff of 100ms, doubling up to 5s. A session
// that reports it was established (and so was lost when it returned)
// starts the backoff over: a subscription that held for a while is tried
// again at once, a server that refuses it is not hammered.
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
// SubscriptionLosses, once against each store that it serves, by the
// store's name.
type LossCounter struct {
	losses *prometheus.CounterVec
	mu     sync.Mutex
	stores map[string]int // the names of the stores served, and how many of each
}

// NewLossCounter returns a counter that counts in losses, which
// SubscriptionLosses returned.
func NewLossCounter(losses *prometheus.CounterVec) *LossCounter {
	return &LossCounter{losses: losses, stores: make(map[string]int)}
}

// Add adds the store called name to those the subscription serves; a
// config reload adds the same name twice, and removes it once.
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
// of kind, then the key's 64 hex digits. The Redis store publishes them
// from Go, the PostgreSQL store's statements compose them in SQL.
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
