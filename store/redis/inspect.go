package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const (
	// scanCount is the COUNT hint of each SCAN: keys looked at per round
	// trip, so that a listing never blocks Redis for long.
	scanCount = 1000
	// peekLen is how much of each scanned value is read. A claim (no
	// headers, no body) fits unless its endpoint is very long, in which case
	// the value is read whole; a completed record is never read beyond its
	// state byte's neighbourhood, whatever its body.
	peekLen = 1024
)

// defaultName names the records this store sees, never the credentials:
// the servers (a single node's address, a Cluster's seeds, a Sentinel
// master and its Sentinels), the database and the key prefix, as in
// "redis 127.0.0.1:6379 db 0 prefix idempotency".
func (s *Store) defaultName() string {
	addrs := slices.Clone(s.opts.Addrs)
	slices.Sort(addrs)
	where := strings.Join(addrs, ",")
	switch {
	case s.opts.MasterName != "":
		where = s.opts.MasterName + " (sentinels " + where + ")"
	case len(addrs) > 1:
		// A Cluster has only database 0.
		return "redis cluster " + where + " prefix " + s.prefix
	}
	return "redis " + where + " db " + strconv.Itoa(s.opts.DB) + " prefix " + s.prefix
}

// Lookup reads key's record and its remaining time to live in one MULTI.
func (s *Store) Lookup(ctx context.Context, key store.Key) (*store.Record, time.Time, error) {
	k := s.key(key)
	var get *goredis.StringCmd
	var pttl *goredis.DurationCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		get = p.Get(ctx, k)
		pttl = p.PTTL(ctx, k)
		return nil
	})
	if errors.Is(err, goredis.Nil) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	val, err := get.Bytes()
	if err != nil {
		return nil, time.Time{}, store.Unavailable("looking up", err)
	}
	rec, err := store.DecodeRecord(val)
	if err != nil {
		return nil, time.Time{}, store.Unavailable("decoding record", err)
	}
	return rec, expiry(now(), pttl.Val()), nil
}

// Delete deletes key, whoever owns it, and announces the purge: every
// instance drops the record from its local tier, and wakes its waiters,
// if any, to claim the key anew. If the announcement fails, the record
// may stay in other instances' tiers until it expires: the error says so,
// and purging again announces it again.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	n, err := s.client.Del(ctx, s.key(key)).Result()
	if err != nil {
		return false, store.Unavailable("deleting", err)
	}
	if s.tier != nil {
		s.tier.Delete(key)
	}
	if err := s.announce(ctx, store.EventPurged, key); err != nil {
		return n > 0, store.Unavailable("announcing the purge to other instances", err)
	}
	return n > 0, nil
}

// InFlight scans the keys of this store's prefix with SCAN, on every master
// of a Cluster, reading the head of each value and its time to live in one
// pipeline per batch, and stops once limit claims are found.
func (s *Store) InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if limit <= 0 {
		return nil, nil
	}
	l := &lister{
		pattern: globEscape(s.prefix) + ":{*}",
		prefix:  s.prefix + ":{",
		cutoff:  now().Add(-olderThan),
		limit:   limit,
	}
	var err error
	if cluster, ok := s.client.(*goredis.ClusterClient); ok {
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
			return l.scan(ctx, node)
		})
	} else {
		err = l.scan(ctx, s.client)
	}
	if err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	return store.SortEntries(l.found, limit), nil
}

// lister collects the claims of one InFlight call; on a Cluster, one
// goroutine per master feeds it.
type lister struct {
	pattern, prefix string
	cutoff          time.Time
	limit           int

	mu    sync.Mutex
	found []store.Entry
}

func (l *lister) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.found) >= l.limit
}

// scan walks the keys of one node.
func (l *lister) scan(ctx context.Context, c goredis.Cmdable) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, l.pattern, scanCount).Result()
		if err != nil {
			return err
		}
		if err := l.inspect(ctx, c, keys); err != nil {
			return err
		}
		if next == 0 || l.full() {
			return nil
		}
		cursor = next
	}
}

// inspect reads the head and the time to live of each key in one pipeline
// and keeps the in-progress claims older than the cutoff.
func (l *lister) inspect(ctx context.Context, c goredis.Cmdable, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	heads := make([]*goredis.StringCmd, len(keys))
	ttls := make([]*goredis.DurationCmd, len(keys))
	// Per-command failures are looked at key by key below: one odd key
	// must not fail the listing.
	_, _ = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, k := range keys {
			heads[i] = p.GetRange(ctx, k, 0, peekLen-1)
			ttls[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	t := now()
	for i, k := range keys {
		key, ok := parseKey(k, l.prefix)
		if !ok {
			continue
		}
		head, err := heads[i].Bytes()
		if err == nil {
			err = ttls[i].Err()
		}
		var reply goredis.Error
		switch {
		case errors.As(err, &reply):
			continue // an error reply for this key alone (another type, a slot on the move)
		case err != nil:
			return err
		}
		ttl := ttls[i].Val()
		// A key deleted or expired since SCAN saw it reads as "" and -2.
		if store.Encoded(head).State() != store.InProgress || ttl == -2 {
			continue
		}
		if len(head) >= peekLen {
			full, err := c.Get(ctx, k).Bytes()
			if errors.Is(err, goredis.Nil) {
				continue
			}
			if err != nil {
				return err
			}
			head = full
		}
		rec, err := store.DecodeRecord(head)
		if err != nil || rec.State != store.InProgress || rec.CreatedAt.After(l.cutoff) {
			continue // not one of ours, or too young
		}
		l.mu.Lock()
		if len(l.found) < l.limit {
			l.found = append(l.found, store.Entry{Key: key, Summary: store.Summarize(rec), ExpiresAt: expiry(t, ttl)})
		}
		l.mu.Unlock()
	}
	return nil
}

// expiry turns a PTTL answer into a time: zero when the key has no expiry
// (-1) or is gone (-2).
func expiry(t time.Time, ttl time.Duration) time.Time {
	if ttl < 0 {
		return time.Time{}
	}
	return t.Add(ttl)
}

var _ store.Inspector = (*Store)(nil)
