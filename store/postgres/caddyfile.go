package postgres

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	postgres {
//	    dsn          <connection string>
//	    table        <name>
//	    schema       <name>
//	    max_conns    <number>
//	    create_table on|off
//	    name         <name>
//	    local_cache  <size>
//	    synchronous_commit on|off|local|remote_write|remote_apply
//	    pipelining   on|off
//	}
//
// Each option may be given once; dsn is required.
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	err := cfarg.Block(d, nil, func(opt string) (err error) {
		switch opt {
		case "dsn":
			s.DSN, err = cfarg.One(d, opt)
		case "table":
			s.Table, err = cfarg.One(d, opt)
		case "schema":
			s.Schema, err = cfarg.One(d, opt)
		case "max_conns":
			s.MaxConns, err = cfarg.Count(d, opt, true)
		case "create_table":
			var v string
			if v, err = cfarg.OneOf(d, opt, "on", "off"); err == nil {
				on := v == "on"
				s.CreateTable = &on
			}
		case "name":
			s.Name, err = cfarg.One(d, opt)
		case "local_cache":
			s.LocalCache, err = cfarg.Size(d, opt, 1<<62)
		case "synchronous_commit":
			s.SynchronousCommit, err = cfarg.OneOf(d, opt, synchronousCommitLevels[1:]...)
		case "pipelining":
			var v string
			v, err = cfarg.OneOf(d, opt, "on", "off")
			s.Pipelining = new(v == "on")
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
	if err == nil && s.DSN == "" {
		return d.Err("dsn: a connection string is required")
	}
	return err
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Store)(nil)
