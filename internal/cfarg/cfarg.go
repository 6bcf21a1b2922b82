// Package cfarg reads the values of Caddyfile options, so that the handler
// and every store word their config errors the same way: the option's
// name, then what is wrong with the value.
package cfarg

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// One reads the single value of option opt.
func One(d *caddyfile.Dispenser, opt string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s: expected a value", opt)
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.Errf("%s: unexpected extra argument '%s'", opt, d.Val())
	}
	return v, nil
}

// Duration reads a duration such as 30s; zero is refused when positive.
func Duration(d *caddyfile.Dispenser, opt string, positive bool) (caddy.Duration, error) {
	v, err := One(d, opt)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur < 0 || (positive && dur == 0) {
		return 0, d.Errf("%s: invalid duration '%s'", opt, v)
	}
	return caddy.Duration(dur), nil
}

// Size reads a positive byte size such as 1MiB, at most 1 TiB.
func Size(d *caddyfile.Dispenser, opt string) (int64, error) {
	v, err := One(d, opt)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > 1<<40 {
		return 0, d.Errf("%s: invalid size '%s' (want for example 1MiB)", opt, v)
	}
	return int64(n), nil
}

// Count reads a non-negative integer.
func Count(d *caddyfile.Dispenser, opt string) (int, error) {
	v, err := One(d, opt)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, d.Errf("%s: '%s' is not a non-negative integer", opt, v)
	}
	return n, nil
}
