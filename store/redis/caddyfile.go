package redis

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	redis {
//	    address      <host:port>...
//	    master_name  <name>
//	    username     <username>
//	    password     <password>
//	    db           <number>
//	    key_prefix   <prefix>
//	    tls
//	    dial_timeout  <duration>
//	    read_timeout  <duration>
//	    write_timeout <duration>
//	    pool_size    <number>
//	    name         <name>
//	    local_cache  <size>
//	    min_replicas <number>
//	    replica_timeout <duration>
//	    pipelining   on|off
//	}
//
// address may be repeated; every other option may be given once.
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
			on := v == "on"
			s.Pipelining = &on
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Store)(nil)
