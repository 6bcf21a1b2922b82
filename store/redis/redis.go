// Package redis is the Redis backend of the idempotency handler. Each store
// method is one round trip: Acquire is a single SET NX GET, and the calls
// that must check the owner token are short server-side scripts.
package redis

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Defaults are short so that a dead Redis costs a request little time:
// the handler then answers per its on_store_error policy.
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

	// Resolved at provisioning; the exported fields keep what was written.
	opts   goredis.UniversalOptions
	prefix string
	// callTimeout bounds one store call on a Cluster, where go-redis may
	// redirect and retry a command several times, each attempt with its own
	// timeouts; zero elsewhere (see bound).
	callTimeout time.Duration
	poolKey     string
	name        string // in the store registry
	client      goredis.UniversalClient
	logger      *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.redis",
		New: func() caddy.Module { return new(Store) },
	}
}

// clients lets every configuration that asks for the same Redis share one
// client, so a config reload neither drops nor doubles connections.
var clients = caddy.NewUsagePool()

type sharedClient struct{ goredis.UniversalClient }

func (c sharedClient) Destruct() error { return c.Close() }

// Provision resolves placeholders, applies defaults and gets a client. It
// does not fail when Redis is down: Caddy must start anyway, and requests
// follow on_store_error until Redis answers.
func (s *Store) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
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
		// go-redis by default tries up to 4 times with 5 dials each, which
		// makes a dead Redis cost seconds per call. One retry still covers
		// a pooled connection that the server closed.
		MaxRetries:    1,
		DialerRetries: 1,
		// Let the caller's deadline cut a call short, too.
		ContextTimeoutEnabled: true,
	}
	if err := s.Validate(); err != nil {
		return err
	}
	if len(s.opts.Addrs) > 1 && s.opts.MasterName == "" {
		s.callTimeout = s.opts.DialTimeout + 2*s.opts.ReadTimeout + s.opts.WriteTimeout
	}

	s.poolKey = s.clientKey()
	val, loaded, err := clients.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		opts := s.opts
		if s.TLS {
			opts.Dialer = tlsDialer(opts.DialTimeout)
		}
		return sharedClient{goredis.NewUniversalClient(&opts)}, nil
	})
	if err != nil {
		s.poolKey = ""
		return fmt.Errorf("creating redis client: %w", err)
	}
	s.client = val.(sharedClient).UniversalClient
	s.name = s.registryName()
	store.Register(s.name, s)
	if !loaded {
		pingCtx, cancel := context.WithTimeout(ctx, provisionPing)
		defer cancel()
		if err := s.client.Ping(pingCtx).Err(); err != nil {
			s.logger.Warn("redis is not answering; requests follow on_store_error until it does",
				zap.Strings("addresses", addrs), zap.Error(err))
		}
	}
	return nil
}

// clientKey identifies the client options without revealing them: the
// password is part of the key, but only through a hash.
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
	case s.DialTimeout < 0 || s.ReadTimeout < 0 || s.WriteTimeout < 0:
		return errors.New("dial_timeout, read_timeout and write_timeout must not be negative")
	case strings.ContainsAny(s.prefix, "{}"):
		// A brace would move the hash tag and split a key's slot choice.
		return fmt.Errorf("key_prefix '%s' must not contain '{' or '}'", s.prefix)
	}
	return nil
}

// Cleanup gives the client back to the pool, closing it with its last user.
func (s *Store) Cleanup() error {
	if s == nil {
		return nil
	}
	// The client stays: requests of the old config may still be finishing
	// after a reload; once the last user is gone their calls fail as
	// unavailable instead of dereferencing nil.
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
	return fmt.Sprintf("redis{addresses=%v master_name=%q username=%q password=%q db=%d key_prefix=%q tls=%t}",
		s.Addresses, s.MasterName, s.Username, pw, s.DB, s.KeyPrefix, s.TLS)
}

// GoString keeps %#v from printing the password.
func (s Store) GoString() string { return s.String() }

// The scripts check "in progress and owned by this token" with one compare
// of a GETRANGE, whatever the size of the record: ARGV[1] is the claim's
// owner prefix (store.AppendOwner), and its length is how much of the
// record they read.
//
// complete swaps an owned claim for the completed record ARGV[2], which
// the handler encodes whole (the claim's binding included), so the script
// only compares the owner prefix and SETs. When go-redis resends the script
// because the first reply was late, the second run finds the record's own
// prefix (state completed, same token) and must report success rather than
// a lost claim.
var completeScript = goredis.NewScript(`
local head = redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1)
if head == ARGV[1] then
	redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
	return 1
end
if head == string.sub(ARGV[2], 1, #ARGV[1]) then return 1 end
return 0
`)

var releaseScript = goredis.NewScript(`
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
`)

var renewScript = goredis.NewScript(`
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`)

// bound gives ctx the store's call deadline on a Cluster, unless it already
// has one as near (as lease renewals do). A single node or a Sentinel
// master needs none: with MaxRetries 1, go-redis makes at most two
// attempts, each bounded by the pool, dial, write and read timeouts; and a
// deadline costs a timer and a context on every call.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.callTimeout == 0 {
		return ctx, noCancel
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.callTimeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.callTimeout)
}

func noCancel() {}

// now is replaced by tests.
var now = time.Now

// Acquire claims key with SET NX GET: one command that either stores the
// claim or returns the live record, which Redis expires by itself when the
// lease or the TTL passes.
func (s *Store) Acquire(ctx context.Context, key store.Key, c *store.Claim) (*store.Record, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	// c.TookOver stays false: a claim's key carries its lease as a TTL, so
	// Redis deletes a dead owner's claim by itself when the lease passes,
	// and SET NX then finds no key at all. Whether one was ever there, and
	// in progress, cannot be told.
	c.TookOver, c.CreatedAt = false, now()
	buf := getBuffer()
	defer putBuffer(buf)
	*buf = store.AppendClaim((*buf)[:0], c, c.CreatedAt)
	cmd := goredis.NewStringCmd(ctx, "set", s.key(key), *buf, "nx", "px", millis(c.Lease), "get")
	_ = s.client.Process(ctx, cmd)
	old, err := cmd.Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, store.Unavailable("acquiring", err)
	}
	rec, err := store.DecodeRecord(old)
	if err != nil {
		return nil, store.Unavailable("decoding record", err)
	}
	// go-redis retries a command whose reply was lost; the record found may
	// then be this very claim, stored by the first attempt.
	if rec.State == store.InProgress && rec.Token == c.Token {
		return nil, nil
	}
	return rec, nil
}

// Complete stores rec in place of the claim c, for ttl.
func (s *Store) Complete(ctx context.Context, key store.Key, c *store.Claim, rec *store.Record, ttl time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	buf := getBuffer()
	defer putBuffer(buf)
	*buf = store.AppendCompleted((*buf)[:0], c, rec)
	return s.owned(completeScript.Run(ctx, s.client, []string{s.key(key)}, owner(c.Token), *buf, millis(ttl)), "completing")
}

// Release deletes the claim held by token.
func (s *Store) Release(ctx context.Context, key store.Key, token store.Token) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.owned(releaseScript.Run(ctx, s.client, []string{s.key(key)}, owner(token)), "releasing")
}

// Renew sets the lease of the claim held by token to lease from now.
func (s *Store) Renew(ctx context.Context, key store.Key, token store.Token, lease time.Duration) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.owned(renewScript.Run(ctx, s.client, []string{s.key(key)}, owner(token), millis(lease)), "renewing")
}

// owned turns a script's 0 or 1 into ErrNotOwner or success.
func (s *Store) owned(cmd *goredis.Cmd, op string) error {
	n, err := cmd.Int64()
	switch {
	case err != nil:
		return store.Unavailable(op, err)
	case n == 0:
		return store.ErrNotOwner
	}
	return nil
}

// key is <prefix>:{<hex key>}; the braces make the key its own Cluster hash
// tag, which every script relies on.
func (s *Store) key(k store.Key) string {
	var h [2 * len(store.Key{})]byte
	hex.Encode(h[:], k[:])
	var b strings.Builder
	b.Grow(len(s.prefix) + 3 + len(h))
	b.WriteString(s.prefix)
	b.WriteString(":{")
	b.Write(h[:])
	b.WriteByte('}')
	return b.String()
}

// buffers hold encoded records while go-redis writes them: it is done with
// its arguments when the call returns.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledBuffer keeps the odd large response from pinning memory in the
// pool.
const maxPooledBuffer = 64 << 10

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooledBuffer {
		buffers.Put(b)
	}
}

// owner is the owner prefix of a claim held by token, for the scripts.
func owner(token store.Token) []byte {
	return store.AppendOwner(make([]byte, 0, store.OwnerLen), token)
}

// millis rounds d up to whole milliseconds, at least one: Redis refuses a
// zero expiry, and rounding down could end a lease early.
func millis(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

// tlsDialer verifies each server against the host of the address it dials,
// which one tls.Config cannot do for the many nodes of a Cluster.
func tlsDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("splitting address %q: %w", addr, err)
		}
		d := tls.Dialer{
			NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute},
			Config:    &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12},
		}
		return d.DialContext(ctx, network, addr)
	}
}

// Interface guards
var (
	_ store.Store        = (*Store)(nil)
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.Validator    = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
)
