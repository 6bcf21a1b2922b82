// Package redis is the Redis backend of the idempotency handler: one round
// trip per store method, and Pub/Sub between instances for waiters and tiers.
package redis

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/tier"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Defaults are short so that a dead Redis costs a request little time.
const (
	defaultAddress      = "127.0.0.1:6379"
	defaultKeyPrefix    = "idempotency"
	defaultDialTimeout  = 2 * time.Second
	defaultReadTimeout  = time.Second
	defaultWriteTimeout = time.Second
	provisionPing       = time.Second
)

// Store keeps idempotency records in Redis: a single node, a Sentinel
// group or a Cluster.
type Store struct {
	// Name is what operators call the store: `caddy idempotency stores`
	// lists it, the admin API's store= and the command's --store choose
	// it, and the metrics and traces carry it. Within one config, every
	// store block for the same records (servers, database and key prefix)
	// must have the same name, and different records different names.
	// Default: the servers, database and key prefix, as in
	// "redis 127.0.0.1:6379 db 0 prefix idempotency".
	Name string `json:"name,omitempty"`

	// Addresses of the Redis servers as host:port. One address is a single
	// node; several are the seeds of a Cluster, or the Sentinels when
	// master_name is set. Default: 127.0.0.1:6379.
	Addresses []string `json:"addresses,omitempty"`

	// MasterName is the Sentinel master to follow; setting it selects
	// Sentinel mode.
	MasterName string `json:"master_name,omitempty"`

	// Username for Redis ACL authentication. Placeholders such as
	// {env.REDIS_USERNAME} are resolved at provisioning.
	Username string `json:"username,omitempty"`

	// Password for Redis authentication. Use a placeholder such as
	// {env.REDIS_PASSWORD} to keep it out of the configuration.
	Password string `json:"password,omitempty"`

	// DB is the database number of a single node or Sentinel master;
	// Cluster supports only 0.
	DB int `json:"db,omitempty"`

	// KeyPrefix starts every key this store writes, so that several
	// applications can share a Redis. Default: idempotency.
	KeyPrefix string `json:"key_prefix,omitempty"`

	// TLS connects to Redis over TLS, verifying each server's certificate
	// against the name in its address.
	TLS bool `json:"tls,omitempty"`

	// DialTimeout bounds connecting to Redis. Default: 2s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ReadTimeout bounds waiting for a reply. Default: 1s.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// WriteTimeout bounds sending a command. Default: 1s.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	// PoolSize is the maximum number of connections per Redis node.
	// Default: go-redis's, 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// LocalCache is the size in bytes of this instance's local tier: a copy
	// of the completed records it has seen, replayed without asking Redis,
	// each until its expiry, the oldest evicted first when full. Purges on
	// any instance reach it over Pub/Sub; while that subscription is down
	// it is emptied and unused. Default: 0, no local tier.
	LocalCache int64 `json:"local_cache,omitempty"`

	// MinReplicas is how many replicas must have a claim before the request
	// runs, and its completion after: the store sends WAIT on the
	// connection that wrote, to the key's master. A claim that fewer
	// acknowledge within replica_timeout is withdrawn and the request
	// answered per on_store_error, so that no request runs on a claim a
	// failover could lose; a completion is kept, counted and sent again
	// while the claim's lease lasts. The server must accept WAIT and have
	// that many replicas: provisioning fails otherwise. Default: 0, no
	// waiting (Redis replicates asynchronously).
	MinReplicas int `json:"min_replicas,omitempty"`

	// ReplicaTimeout bounds each wait for min_replicas; it must be shorter
	// than read_timeout. Default: 100ms.
	ReplicaTimeout caddy.Duration `json:"replica_timeout,omitempty"`

	// Pipelining sends the store calls that arrive while others are on
	// the wire together, as one pipeline per Redis node, so that they share
	// one round trip and Redis reads and answers them in one go; a call
	// that finds the wire idle goes at once, alone. Set it to false to
	// send every call on its own. Default: true.
	Pipelining *bool `json:"pipelining,omitempty"`

	// Resolved at provisioning; the exported fields keep what was written.
	opts        goredis.UniversalOptions
	prefix      string
	callTimeout time.Duration // zero but on a Cluster, which may redirect and retry (see bound)
	poolKey     string
	name        string // in the store registry
	client      goredis.UniversalClient
	calls       caller       // the records' commands: the client's batcher, or the client
	events      *subscriber  // the client's
	channel     string       // this prefix's events channel
	tier        *tier.Cache  // nil without local_cache
	replicas    *replication // nil without min_replicas
	logger      *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.redis",
		New: func() caddy.Module { return new(Store) },
	}
}

// clients shares one client among the configs that ask for the same Redis,
// so a reload neither drops nor doubles connections, subscription or tiers.
var clients = caddy.NewUsagePool()

type sharedClient struct {
	goredis.UniversalClient
	events *subscriber
	calls  *batcher
	stop   context.CancelFunc // ends the client's watchers
}

// caller sends the commands that read and write records.
type caller interface {
	goredis.Scripter
	Process(ctx context.Context, cmd goredis.Cmder) error
}

func (c *sharedClient) Destruct() error {
	c.stop()
	c.events.close()
	return c.Close()
}

// Provision resolves placeholders, applies defaults and gets a client. It
// does not fail when Redis is down: requests follow on_store_error until then.
func (s *Store) Provision(ctx caddy.Context) error {
	if s.logger == nil { // one set before, by a test, is kept
		s.logger = ctx.Logger()
	}
	repl := caddy.NewReplacer()
	resolve := func(v string) string { return repl.ReplaceKnown(v, "") }

	addrs := []string{defaultAddress}
	if len(s.Addresses) > 0 {
		addrs = make([]string, len(s.Addresses))
		for i, a := range s.Addresses {
			addrs[i] = resolve(a)
		}
	}
	s.prefix = cmp.Or(resolve(s.KeyPrefix), defaultKeyPrefix)
	s.opts = goredis.UniversalOptions{
		Addrs:        addrs,
		MasterName:   resolve(s.MasterName),
		Username:     resolve(s.Username),
		Password:     resolve(s.Password),
		DB:           s.DB,
		DialTimeout:  cmp.Or(time.Duration(s.DialTimeout), defaultDialTimeout),
		ReadTimeout:  cmp.Or(time.Duration(s.ReadTimeout), defaultReadTimeout),
		WriteTimeout: cmp.Or(time.Duration(s.WriteTimeout), defaultWriteTimeout),
		PoolSize:     s.PoolSize,
		// go-redis's default retries make a dead Redis cost seconds a call;
		// one retry still covers a pooled connection the server closed.
		MaxRetries:    1,
		DialerRetries: 1,
		// Let the caller's deadline cut a call short, too.
		ContextTimeoutEnabled: true,
		// Pipelines run on the main pool: pool_size bounds every
		// connection, and a Sentinel failover drops them all at once.
		PipelinePoolSize: -1,
	}
	if err := s.Validate(); err != nil {
		return err
	}
	cluster := len(s.opts.Addrs) > 1 && s.opts.MasterName == ""
	if cluster {
		s.callTimeout = s.opts.DialTimeout + 2*s.opts.ReadTimeout + s.opts.WriteTimeout
	}
	losses, err := store.SubscriptionLosses(ctx.GetMetricsRegistry())
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}

	s.poolKey = s.clientKey()
	val, loaded, err := clients.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		opts := s.opts
		if s.TLS {
			opts.Dialer = tlsDialer(opts.DialTimeout)
		}
		client := goredis.NewUniversalClient(&opts)
		life, stop := context.WithCancel(context.Background())
		go watchEviction(life, client, opts.Addrs, s.logger)
		events := newSubscriber(client, cluster, opts.MasterName != "", losses, s.logger)
		return &sharedClient{client, events, newBatcher(life, client), stop}, nil
	})
	if err != nil {
		s.poolKey = ""
		return fmt.Errorf("creating redis client: %w", err)
	}
	shared := val.(*sharedClient)
	s.client, s.events, s.calls = shared.UniversalClient, shared.events, shared.calls
	if s.Pipelining != nil && !*s.Pipelining {
		s.calls = s.client
	}
	s.channel = eventsChannel(s.prefix)
	records := s.defaultName()
	s.name = cmp.Or(s.Name, records)
	s.tier = s.events.join(s.channel, s.LocalCache, s.name)
	if err := store.Register(ctx.Context, store.Registration{Name: s.name, Module: "redis", Store: s}, records); err != nil {
		return err // Caddy's call of Cleanup gives the client back
	}
	pingCtx, cancel := context.WithTimeout(ctx, provisionPing)
	defer cancel()
	if s.MinReplicas > 0 {
		return s.provisionReplication(ctx, pingCtx)
	}
	if !loaded {
		if err := s.client.Ping(pingCtx).Err(); err != nil {
			s.logger.Warn("redis is not answering; requests follow on_store_error until it does",
				zap.Strings("addresses", addrs), zap.Error(err))
		}
	}
	return nil
}

// provisionReplication sets up min_replicas, checking the servers if they answer.
func (s *Store) provisionReplication(ctx caddy.Context, checkCtx context.Context) error {
	r, err := newReplication(ctx, s.MinReplicas, s.replicaTimeout(), s.client, s.name, ctx.GetMetricsRegistry(), s.logger)
	if err != nil {
		return err
	}
	s.replicas = r
	if reachable, err := r.check(checkCtx); !reachable {
		s.logger.Warn("redis is not answering; min_replicas is checked by the first claim, and requests follow on_store_error until then",
			zap.Strings("addresses", s.opts.Addrs), zap.Error(err))
	} else if err != nil {
		return err
	}
	return nil
}

func (s *Store) replicaTimeout() time.Duration {
	return cmp.Or(time.Duration(s.ReplicaTimeout), defaultReplicaTimeout)
}

// clientKey identifies the client options, the password only through a hash.
func (s *Store) clientKey() string {
	b, _ := json.Marshal([]any{s.opts.Addrs, s.opts.MasterName, s.opts.Username, s.opts.Password,
		s.opts.DB, s.TLS, s.opts.DialTimeout, s.opts.ReadTimeout, s.opts.WriteTimeout, s.opts.PoolSize})
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:])
}

// Validate checks the provisioned configuration without contacting Redis.
func (s *Store) Validate() error {
	if len(s.opts.Addrs) == 0 {
		return errors.New("redis store is not provisioned")
	}
	for _, a := range s.opts.Addrs {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return fmt.Errorf("address '%s' is not host:port", a)
		}
	}
	switch {
	case s.DB < 0:
		return fmt.Errorf("db %d is negative", s.DB)
	case s.DB != 0 && len(s.opts.Addrs) > 1 && s.opts.MasterName == "":
		return fmt.Errorf("db %d is not supported on a Redis Cluster (several addresses without master_name)", s.DB)
	case s.PoolSize < 0:
		return fmt.Errorf("pool_size %d is negative", s.PoolSize)
	case s.LocalCache < 0:
		return fmt.Errorf("local_cache %d is negative", s.LocalCache)
	case s.DialTimeout < 0 || s.ReadTimeout < 0 || s.WriteTimeout < 0:
		return errors.New("dial_timeout, read_timeout and write_timeout must not be negative")
	case s.MinReplicas < 0:
		return fmt.Errorf("min_replicas %d is negative", s.MinReplicas)
	case s.ReplicaTimeout < 0:
		return fmt.Errorf("replica_timeout %v is negative", time.Duration(s.ReplicaTimeout))
	case s.MinReplicas > 0 && s.replicaTimeout() >= s.opts.ReadTimeout:
		// A WAIT in a pipeline is read within read_timeout.
		return fmt.Errorf("replica_timeout %v must be shorter than read_timeout %v", s.replicaTimeout(), s.opts.ReadTimeout)
	case strings.ContainsAny(s.prefix, "{}"):
		// A brace would move the hash tag and split a key's slot choice.
		return fmt.Errorf("key_prefix '%s' must not contain '{' or '}'", s.prefix)
	}
	return nil
}

// Cleanup gives the client back to the pool, closing it with its last
// user once the requests that hold this store are done (store.Holds).
func (s *Store) Cleanup() error {
	if s == nil {
		return nil
	}
	// The client and tier stay set, for the old config's last calls to fail
	// as unavailable rather than on nil.
	if s.poolKey != "" {
		s.events.leave(s.channel, s.LocalCache, s.name)
	}
	if err := store.Detach(s, s.name, clients, &s.poolKey); err != nil {
		return fmt.Errorf("closing redis client: %w", err)
	}
	return nil
}

// String describes the store for logs, with the password redacted. It has a
// value receiver so that printing a Store value is redacted too.
func (s Store) String() string {
	pw := ""
	if s.Password != "" {
		pw = "<redacted>"
	}
	return fmt.Sprintf("redis{addresses=%v master_name=%q username=%q password=%q db=%d key_prefix=%q tls=%t local_cache=%d min_replicas=%d pipelining=%t}",
		s.Addresses, s.MasterName, s.Username, pw, s.DB, s.KeyPrefix, s.TLS, s.LocalCache, s.MinReplicas, s.Pipelining == nil || *s.Pipelining)
}

// GoString keeps %#v from printing the password.
func (s Store) GoString() string { return s.String() }

var (
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.Validator    = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
)
