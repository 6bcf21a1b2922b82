package idempotency

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// A ttl or lock_timeout so long that a record's end would fall past what a
// time in nanoseconds can hold (the year 2262) is refused when the config
// loads, naming the option; a long one that fits is taken.
func TestDurationsThatOverflowAreRefused(t *testing.T) {
	for _, tc := range []struct {
		opt, value string
		ok         bool
	}{
		{"ttl", "87000d", false},
		{"lock_timeout", "87000d", false},
		{"max_wait", "87000d", false},
		{"ttl", "36500d", true},
		{"lock_timeout", "3650d", true},
	} {
		extra := ""
		if tc.opt == "max_wait" {
			extra = `"on_conflict":"wait",`
		}
		cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[{"handler":"idempotency",` +
			extra + `"` + tc.opt + `":"` + tc.value + `"},{"handler":"static_response","status_code":201}]}]}}}}}`
		var c caddy.Config
		if err := json.Unmarshal([]byte(cfg), &c); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(&c)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s %s: %v, want it taken", tc.opt, tc.value, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.opt)):
			t.Errorf("%s %s: %v, want an error that names %s", tc.opt, tc.value, err, tc.opt)
		}
	}
}
