package redis

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
)

// UnmarshalCaddyfile sets up the store from a redis block (docs/stores/redis.md).
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return cfarg.Block(d, []string{"address"}, func(opt string) (err error) {
		switch opt {
		case "address":
			var addrs []string
			addrs, err = cfarg.List(d, opt)
			s.Addresses = append(s.Addresses, addrs...)
		case "master_name":
			s.MasterName, err = cfarg.One(d, opt)
		case "username":
			s.Username, err = cfarg.One(d, opt)
		case "password":
			s.Password, err = cfarg.One(d, opt)
		case "key_prefix":
			s.KeyPrefix, err = cfarg.One(d, opt)
		case "db":
			s.DB, err = cfarg.Count(d, opt, false)
		case "pool_size":
			s.PoolSize, err = cfarg.Count(d, opt, false)
		case "tls":
			err = cfarg.Flag(d, opt)
			s.TLS = true
		case "dial_timeout":
			s.DialTimeout, err = cfarg.Duration(d, opt, false)
		case "read_timeout":
			s.ReadTimeout, err = cfarg.Duration(d, opt, false)
		case "write_timeout":
			s.WriteTimeout, err = cfarg.Duration(d, opt, false)
		case "name":
			s.Name, err = cfarg.One(d, opt)
		case "local_cache":
			s.LocalCache, err = cfarg.Size(d, opt, 1<<62)
		case "min_replicas":
			s.MinReplicas, err = cfarg.Count(d, opt, false)
		case "replica_timeout":
			s.ReplicaTimeout, err = cfarg.Duration(d, opt, true)
		case "pipelining":
			var v string
			v, err = cfarg.OneOf(d, opt, "on", "off")
			s.Pipelining = new(v == "on")
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
}

var _ caddyfile.Unmarshaler = (*Store)(nil)
