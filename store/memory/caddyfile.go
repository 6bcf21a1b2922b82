package memory

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/internal/cfarg"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens. Syntax:
//
//	memory {
//	    max_entries <n>
//	    max_bytes   <size>
//	    name        <name>
//	}
//
// Each option may be given once.
func (m *Memory) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return cfarg.Block(d, nil, func(opt string) (err error) {
		switch opt {
		case "max_entries":
			m.MaxEntries, err = cfarg.Count(d, opt, true)
		case "max_bytes":
			// Keep the table's sums of sizes far from overflowing.
			m.MaxBytes, err = cfarg.Size(d, opt, 1<<62)
		case "name":
			m.Name, err = cfarg.One(d, opt)
		default:
			err = cfarg.Unrecognized(d, opt)
		}
		return err
	})
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Memory)(nil)
