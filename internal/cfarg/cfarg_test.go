package cfarg

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// parse reads a block of the options every reader is exercised with, the
// way a store's UnmarshalCaddyfile does.
func parse(in string) (map[string]any, error) {
	got := make(map[string]any)
	d := caddyfile.NewTestDispenser(in)
	err := Block(d, []string{"list"}, func(opt string) (err error) {
		switch opt {
		case "one":
			got[opt], err = One(d, opt)
		case "list":
			var vals []string
			vals, err = List(d, opt)
			before, _ := got[opt].([]string)
			got[opt] = append(before, vals...)
		case "flag":
			err = Flag(d, opt)
			got[opt] = true
		case "choice":
			got[opt], err = OneOf(d, opt, "on", "off")
		case "duration":
			got[opt], err = Duration(d, opt, true)
		case "size":
			got[opt], err = Size(d, opt, 1<<20)
		case "count":
			got[opt], err = Count(d, opt, false)
		case "positive":
			got[opt], err = Count(d, opt, true)
		default:
			err = Unrecognized(d, opt)
		}
		return err
	})
	return got, err
}

func TestBlock(t *testing.T) {
	got, err := parse("m {\n one a\n list x y\n list z\n flag\n choice off\n duration 2s\n size 1KiB\n count 0\n positive 3\n}")
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := got["list"].([]string); strings.Join(l, ",") != "x,y,z" || got["one"] != "a" || got["flag"] != true ||
		got["choice"] != "off" || got["duration"] != caddy.Duration(2*time.Second) || got["size"] != int64(1024) ||
		got["count"] != 0 || got["positive"] != 3 {
		t.Errorf("parsed %v", got)
	}
	if _, err := parse("m"); err != nil {
		t.Errorf("no block: %v", err)
	}
}

func TestBlockErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"m arg", "unexpected argument 'arg'; options go in a block"},
		{"m {\n colour blue\n}", "unrecognized subdirective 'colour'"},
		{"m {\n one a\n one b\n}", "one already specified"},
		{"m {\n flag\n flag\n}", "flag already specified"},
		{"m {\n one\n}", "one: expected a value"},
		{"m {\n one a b\n}", "one: unexpected extra argument 'b'"},
		{"m {\n list\n}", "list: expected at least one value"},
		{"m {\n flag on\n}", "flag: unexpected argument 'on'"},
		{"m {\n choice yes\n}", "choice: want on or off, got 'yes'"},
		{"m {\n duration 0s\n}", "duration: invalid duration '0s'"},
		{"m {\n duration -1s\n}", "duration: invalid duration '-1s'"},
		{"m {\n size 0\n}", "size: invalid size '0'"},
		{"m {\n size 2MiB\n}", "size: invalid size '2MiB'"},
		{"m {\n count -1\n}", "count: '-1' is not a non-negative integer"},
		{"m {\n positive 0\n}", "positive: '0' is not a positive integer"},
		{"m {\n positive many\n}", "positive: 'many' is not a positive integer"},
	} {
		_, err := parse(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}
