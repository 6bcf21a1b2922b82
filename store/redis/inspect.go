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
	// scanCount is each SCAN's COUNT hint, so a listing never blocks Redis long.
	scanCount = 1000
	// peekLen is how much of a value is read; a longer claim is read whole.
	peekLen = 1024
)

// defaultName names the records by servers, database and prefix, not credentials.
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

// Lookup reads key's record and its remaining time to live in one MULTI. A
// claim's lease end is in its head; a dead owner's claim is no live record.
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
	val, _ := get.Bytes() // the pipeline's error is its commands' first
	t := now()
	if leasePassed(val, t) {
		return nil, time.Time{}, nil
	}
	rec, err := decode(val)
	if err != nil {
		return nil, time.Time{}, err
	}
	return rec, expiresAt(rec, t, pttl.Val()), nil
}

// expiresAt is when a live record's lease or TTL ends: a claim's lease end
// from its head, a completed record's from the key's expiry, a PTTL answer,
// zero for no expiry (-1) or gone (-2).
func expiresAt(rec *store.Record, t time.Time, pttl time.Duration) time.Time {
	switch {
	case rec.State == store.InProgress:
		return rec.ExpiresAt
	case pttl < 0:
		return time.Time{}
	}
	return t.Add(pttl)
}

// Delete deletes key, whoever owns it, and announces the purge; if that
// fails, other tiers may keep the record until it expires, as the error says.
// A dead owner's claim is deleted too, but was no live record.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	k := s.key(key)
	var head *goredis.StringCmd
	var del *goredis.IntCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		head = p.GetRange(ctx, k, 0, int64(store.FlagsOffset))
		del = p.Del(ctx, k)
		return nil
	})
	if err != nil {
		return false, store.Unavailable("deleting", err)
	}
	found := del.Val() > 0 && !leasePassed(store.Encoded(head.Val()), now())
	if s.tier != nil {
		s.tier.Delete(key)
	}
	if err := s.announce(ctx, store.EventPurged, key); err != nil {
		return found, store.Unavailable("announcing the purge to other instances", err)
	}
	return found, nil
}

// InFlight SCANs every master for live claims, a pipeline of heads a batch.
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
	if err := forEachMaster(ctx, s.client, l.scan); err != nil {
		return nil, store.Unavailable("listing claims", err)
	}
	return store.SortEntries(l.found, limit), nil
}

// forEachMaster runs fn on every master of a Cluster, or on the one master.
func forEachMaster(ctx context.Context, client goredis.UniversalClient, fn func(context.Context, *goredis.Client) error) error {
	if cc, ok := client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, fn)
	}
	return fn(ctx, client.(*goredis.Client))
}

// lister collects one InFlight's claims, from a goroutine per master.
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

func (l *lister) scan(ctx context.Context, c *goredis.Client) error {
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

// inspect keeps the keys that are in-progress claims older than the cutoff.
func (l *lister) inspect(ctx context.Context, c goredis.Cmdable, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	heads := make([]*goredis.StringCmd, len(keys))
	// Errors are looked at key by key: one odd key must not fail the listing.
	_, _ = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, k := range keys {
			heads[i] = p.GetRange(ctx, k, 0, peekLen-1)
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
		var reply goredis.Error
		switch {
		case errors.As(err, &reply):
			continue // an error reply for this key alone (another type, a slot on the move)
		case err != nil:
			return err
		}
		// A key deleted or expired since SCAN saw it reads as ""; a dead
		// owner's claim is no claim in flight.
		if store.Encoded(head).State() != store.InProgress || leasePassed(head, t) {
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
			l.found = append(l.found, store.Entry{Key: key, Summary: store.Summarize(rec), ExpiresAt: rec.ExpiresAt})
		}
		l.mu.Unlock()
	}
	return nil
}

var _ store.Inspector = (*Store)(nil)
