package postgres

import (
	"strconv"

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
//	}
//
// Each option may be given once; dsn is required.
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.Errf("unexpected argument '%s'; options go in a block", d.Val())
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("duplicate subdirective '%s'", opt)
		}
		seen[opt] = true

		switch opt {
		case "dsn", "table", "schema", "max_conns", "create_table":
		default:
			return d.Errf("unrecognized subdirective '%s'", opt)
		}
		// Every option takes exactly one value.
		val, err := cfarg.One(d, opt)
		if err != nil {
			return err
		}
		switch opt {
		case "dsn":
			s.DSN = val
		case "table":
			s.Table = val
		case "schema":
			s.Schema = val
		case "max_conns":
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				return d.Errf("max_conns: '%s' is not a positive integer", val)
			}
			s.MaxConns = n
		case "create_table":
			var on bool
			switch val {
			case "on":
				on = true
			case "off":
			default:
				return d.Errf("create_table: '%s' is not on or off", val)
			}
			s.CreateTable = &on
		}
	}
	if s.DSN == "" {
		return d.Err("dsn: a connection string is required")
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Store)(nil)
