package file

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	file {
//	    path <directory>
//	    name <name>
//	}
//
// Each option may be given once.
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return cfarg.Block(d, nil, func(opt string) (err error) {
		switch opt {
		case "path":
			s.Path, err = cfarg.One(d, opt)
		case "name":
			s.Name, err = cfarg.One(d, opt)
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Store)(nil)
