// Package cfarg reads Caddyfile options, so that the handler and every
// store walk their block and word their config errors the same way: the
// option's name, then what is wrong with the value.
package cfarg

import (
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// Block reads a directive or module that takes no argument, only a block
// of options: it calls option with the name of each, the dispenser on that
// name. An option given twice is refused, unless repeatable names it.
func Block(d *caddyfile.Dispenser, repeatable []string, option func(opt string) error) error {
	d.Next() // the directive or module name
	if d.NextArg() {
		return d.Errf("unexpected argument '%s'; options go in a block", d.Val())
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		opt := d.Val()
		if seen[opt] && !slices.Contains(repeatable, opt) {
			return d.Errf("%s already specified", opt)
		}
		seen[opt] = true
		if err := option(opt); err != nil {
			return err
		}
	}
	return nil
}

// Unrecognized is the error for an option that the block does not know.
func Unrecognized(d *caddyfile.Dispenser, opt string) error {
	return d.Errf("unrecognized subdirective '%s'", opt)
}

// Flag reads an option that takes no value.
func Flag(d *caddyfile.Dispenser, opt string) error {
	if d.NextArg() {
		return d.Errf("%s: unexpected argument '%s'", opt, d.Val())
	}
	return nil
}

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

// List reads the values of option opt, at least one.
func List(d *caddyfile.Dispenser, opt string) ([]string, error) {
	vals := d.RemainingArgs()
	if len(vals) == 0 {
		return nil, d.Errf("%s: expected at least one value", opt)
	}
	return vals, nil
}

// OneOf reads a value that must be one of choices.
func OneOf(d *caddyfile.Dispenser, opt string, choices ...string) (string, error) {
	v, err := One(d, opt)
	if err != nil {
		return "", err
	}
	if !slices.Contains(choices, v) {
		return "", d.Errf("%s: want %s, got '%s'", opt, strings.Join(choices, " or "), v)
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

// Size reads a positive byte size such as 1MiB, at most limit.
func Size(d *caddyfile.Dispenser, opt string, limit uint64) (int64, error) {
	v, err := One(d, opt)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > limit {
		return 0, d.Errf("%s: invalid size '%s' (want for example 1MiB)", opt, v)
	}
	return int64(n), nil
}

// Count reads a non-negative integer; zero is refused when positive.
func Count(d *caddyfile.Dispenser, opt string, positive bool) (int, error) {
	v, err := One(d, opt)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	switch {
	case positive && (err != nil || n <= 0):
		return 0, d.Errf("%s: '%s' is not a positive integer", opt, v)
	case err != nil || n < 0:
		return 0, d.Errf("%s: '%s' is not a non-negative integer", opt, v)
	}
	return n, nil
}
