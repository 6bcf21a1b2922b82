package idempotency

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// An empty list in JSON is a config error that names the option, on a
// route and in the idempotency app's defaults alike: "methods": [] would
// otherwise protect nothing, and "release_statuses": [] release nothing,
// without a word. Leaving the option out gives its default.
func TestEmptyListsAreRefused(t *testing.T) {
	lists := []string{"methods", "release_statuses", "fingerprint_ignore", "fingerprint_only", "fingerprint_headers", "encryption_keys"}
	for _, opt := range lists {
		for _, where := range []string{"route", "app"} {
			t.Run(opt+"/"+where, func(t *testing.T) {
				handler := `{"handler":"idempotency","fingerprint":"json"}`
				apps := ""
				if where == "route" {
					handler = `{"handler":"idempotency","fingerprint":"json","` + opt + `":[]}`
				} else {
					apps = `"idempotency":{"fingerprint":"json","` + opt + `":[]},`
				}
				cfg := `{"admin":{"disabled":true},"apps":{` + apps + `"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[` +
					handler + `,{"handler":"static_response","status_code":201}]}]}}}}}`
				var c caddy.Config
				if err := json.Unmarshal([]byte(cfg), &c); err != nil {
					t.Fatal(err)
				}
				err := caddy.Validate(&c)
				if err == nil || !strings.Contains(err.Error(), opt) {
					t.Fatalf("validating %s: %v; want an error that names %s", cfg, err, opt)
				}
			})
		}
	}
}
