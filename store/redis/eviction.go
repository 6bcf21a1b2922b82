package redis

import (
	"context"
	"errors"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Every key has a TTL, so any policy but noeviction lets a full Redis evict a
// live claim, and its retry runs again; only the server knows its policy
// (docs/stores/redis.md#run-redis-with-maxmemory-policy-noeviction).

// watchEviction reads the eviction policy of every master once it answers,
// and names a policy that may drop claims. It runs beside provisioning, which
// must not wait for a Redis that may be down: a master that does not answer
// is asked again later, until life, the client's, ends.
func watchEviction(life context.Context, client goredis.UniversalClient, addrs []string, logger *zap.Logger) {
	_, cluster := client.(*goredis.ClusterClient)
	var read sync.Map // master addresses whose policy was read
	check := func(ctx context.Context, c *goredis.Client) error {
		addr := c.Options().Addr
		if _, done := read.Load(addr); done {
			return nil
		}
		log := logger.With(zap.Strings("addresses", addrs))
		if cluster {
			log = log.With(zap.String("master", addr))
		}
		if err := readEviction(ctx, c, log); err != nil {
			return err
		}
		read.Store(addr, true)
		return nil
	}
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		ctx, cancel := context.WithTimeout(life, provisionPing)
		err := forEachMaster(ctx, client, check)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-life.Done():
			return
		case <-time.After(wait):
		}
	}
}

// readEviction logs c's policy, and fails only if c did not answer. A refusal
// (CONFIG renamed away, NOPERM) is logged at info: managed services refuse by
// design, and all the operator can do is check the policy, as the line says.
func readEviction(ctx context.Context, c *goredis.Client, log *zap.Logger) error {
	cmd := goredis.NewMapStringStringCmd(ctx, "config", "get", "maxmemory", "maxmemory-policy")
	_ = c.Process(ctx, cmd)
	vals, err := cmd.Result()
	var refused goredis.Error
	if err != nil && !errors.As(err, &refused) {
		return err
	}
	policy, maxmemory := vals["maxmemory-policy"], vals["maxmemory"]
	switch {
	case err != nil || policy == "":
		log.Info("could not read redis's maxmemory-policy; it must be noeviction, or a retry runs again once Redis evicts its claim or record", zap.Error(err))
	case maxmemory != "0" && policy != "noeviction":
		log.Warn("redis may evict claims and records: with maxmemory set and a maxmemory-policy other than noeviction, a retry runs again once its claim or record is evicted; set maxmemory-policy noeviction",
			zap.String("maxmemory-policy", policy), zap.String("maxmemory", maxmemory))
	default:
		log.Debug("redis evicts no claim (maxmemory-policy noeviction, or no maxmemory)",
			zap.String("maxmemory-policy", policy), zap.String("maxmemory", maxmemory))
	}
	return nil
}
