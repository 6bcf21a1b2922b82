package idempotency

import (
	"context"
	"encoding/json"
	"os"

	"github.com/caddyserver/caddy/v2"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

func TestAdaptEveryOption(t *testing.T) {
	caddytest.AssertAdapt(t, `
:8080 {
	idempotency /api/* {
		key_header        X-Idempotency-Key
		methods           POST PUT PATCH
		required
		scope             {http.request.header.X-Tenant}
		endpoint          {method} {path} {header.X-Api-Version}
		ttl               48h
		lock_timeout      1m
		max_request_body  2MiB
		max_response_body 512KiB
		on_store_error    fail_open
		on_conflict       wait 5s
		on_unknown_outcome keep
		store_server_errors
		release_statuses  429 503
		replay_header     X-Replayed
		disable_metrics
		store redis {
			address    10.0.0.1:6379 10.0.0.2:6379
			address    10.0.0.3:6379
			username   app
			password   {env.REDIS_PASSWORD}
			db         2
			key_prefix shop
			tls
		}
	}
	reverse_proxy 127.0.0.1:9000
}`, "caddyfile", `{
	"apps": {
		"http": {
			"servers": {
				"srv0": {
					"listen": [
						":8080"
					],
					"routes": [
						{
							"match": [
								{
									"path": [
										"/api/*"
									]
								}
							],
							"handle": [
								{
									"disable_metrics": true,
									"endpoint": "{http.request.method} {http.request.uri.path} {http.request.header.X-Api-Version}",
									"handler": "idempotency",
									"key_header": "X-Idempotency-Key",
									"lock_timeout": 60000000000,
									"max_request_body": 2097152,
									"max_response_body": 524288,
									"max_wait": 5000000000,
									"methods": [
										"POST",
										"PUT",
										"PATCH"
									],
									"on_conflict": "wait",
									"on_store_error": "fail_open",
									"on_unknown_outcome": "keep",
									"release_statuses": [
										429,
										503
									],
									"replay_header": "X-Replayed",
									"required": true,
									"scope": "{http.request.header.X-Tenant}",
									"store": {
										"addresses": [
											"10.0.0.1:6379",
											"10.0.0.2:6379",
											"10.0.0.3:6379"
										],
										"db": 2,
										"key_prefix": "shop",
										"module": "redis",
										"password": "{env.REDIS_PASSWORD}",
										"tls": true,
										"username": "app"
									},
									"store_server_errors": true,
									"ttl": 172800000000000
								}
							]
						},
						{
							"handle": [
								{
									"handler": "reverse_proxy",
									"upstreams": [
										{
											"dial": "127.0.0.1:9000"
										}
									]
								}
							]
						}
					]
				}
			}
		}
	}
}`)
}

// The directive runs inside authentication and compression and before
// every handler that answers, whatever order the Caddyfile lists them in.
func TestAdaptDirectiveOrder(t *testing.T) {
	caddytest.AssertAdapt(t, `
:8080 {
	reverse_proxy 127.0.0.1:9000
	idempotency {
		store memory
	}
	encode gzip
	basic_auth {
		alice $2a$04$abcdefghijklmnopqrstuuO0K4qJvYy0pI8lq3c6oTiGxqfxtM2ae
	}
}`, "caddyfile", `{
	"apps": {
		"http": {
			"servers": {
				"srv0": {
					"listen": [
						":8080"
					],
					"routes": [
						{
							"handle": [
								{
									"handler": "authentication",
									"providers": {
										"http_basic": {
											"accounts": [
												{
													"password": "$2a$04$abcdefghijklmnopqrstuuO0K4qJvYy0pI8lq3c6oTiGxqfxtM2ae",
													"username": "alice"
												}
											],
											"hash": {
												"algorithm": "bcrypt"
											},
											"hash_cache": {}
										}
									}
								},
								{
									"encodings": {
										"gzip": {}
									},
									"handler": "encode",
									"prefer": [
										"gzip"
									]
								},
								{
									"handler": "idempotency",
									"store": {
										"module": "memory"
									}
								},
								{
									"handler": "reverse_proxy",
									"upstreams": [
										{
											"dial": "127.0.0.1:9000"
										}
									]
								}
							]
						}
					]
				}
			}
		}
	}
}`)
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`idempotency extra`, "unexpected argument 'extra'"},
		{"idempotency {\n colour blue\n}", "unrecognized subdirective 'colour'"},
		{"idempotency {\n ttl 1h\n ttl 2h\n}", "ttl already specified"},
		{"idempotency {\n ttl soon\n}", "ttl: invalid duration 'soon'"},
		{"idempotency {\n ttl -5s\n}", "ttl: invalid duration '-5s'"},
		{"idempotency {\n lock_timeout\n}", "lock_timeout: expected a value"},
		{"idempotency {\n lock_timeout 1s 2s\n}", "lock_timeout: unexpected extra argument '2s'"},
		{"idempotency {\n max_request_body huge\n}", "max_request_body: invalid size 'huge'"},
		{"idempotency {\n max_response_body 0\n}", "max_response_body: invalid size '0'"},
		{"idempotency {\n on_store_error ignore\n}", "on_store_error: want fail_closed or fail_open, got 'ignore'"},
		{"idempotency {\n on_conflict queue\n}", "on_conflict: want reject or wait, got 'queue'"},
		{"idempotency {\n on_conflict wait\n}", "on_conflict wait: expected a value"},
		{"idempotency {\n on_conflict wait never\n}", "on_conflict wait: invalid duration 'never'"},
		{"idempotency {\n on_conflict reject 5s\n}", "on_conflict reject: unexpected argument '5s'"},
		{"idempotency {\n disable_metrics now\n}", "disable_metrics: unexpected argument 'now'"},
		{"idempotency {\n on_unknown_outcome forget\n}", "on_unknown_outcome: want release or keep, got 'forget'"},
		{"idempotency {\n on_unknown_outcome\n}", "on_unknown_outcome: expected a value"},
		{"idempotency {\n store_server_errors on\n}", "store_server_errors: unexpected argument 'on'"},
		{"idempotency {\n required yes\n}", "required: unexpected argument 'yes'"},
		{"idempotency {\n release_statuses\n}", "release_statuses: expected at least one value"},
		{"idempotency {\n release_statuses many\n}", "release_statuses: want statuses, got 'many'"},
		{"idempotency {\n methods\n}", "methods: expected at least one value"},
		{"idempotency {\n endpoint\n}", "endpoint: expected at least one value"},
		{"idempotency {\n key_header\n}", "key_header: expected a value"},
		{"idempotency {\n store\n}", "store: want a store name"},
		{"idempotency {\n store dynamo\n}", "http.idempotency.stores.dynamo"},
		{"idempotency {\n store memory\n store memory\n}", "store already specified"},
		{"idempotency {\n store redis {\n  db x\n }\n}", "db"},
		{"idempotency {\n store redis {\n  colour blue\n }\n}", "unrecognized subdirective 'colour'"},
		// Two names for the key's header: neither may silently win.
		{"idempotency {\n key_from header X-A\n key_header X-B\n}", "key_header: the key's place is named already"},
		{"idempotency {\n key_header X-B\n key_from header X-A\n}", "key_from: the key's place is named already"},
		{"idempotency {\n key_from json /id\n key_header X-B\n}", "key_header: the key's place is named already"},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "Testfile:") {
			t.Errorf("%q: error %q does not name the line", tc.in, err)
		}
	}
}

func TestValidateRefusesBadJSONConfig(t *testing.T) {
	for _, tc := range []struct {
		h    Handler
		want string
	}{
		{Handler{Options: app.Options{KeyHeader: "bad header"}}, "key_header"},
		{Handler{Options: app.Options{ReplayHeader: "x:y"}}, "replay_header"},
		{Handler{Options: app.Options{Methods: []string{"PO ST"}}}, "methods"},
		{Handler{Options: app.Options{TTL: -1}}, "ttl"},
		{Handler{Options: app.Options{LockTimeout: 1000}}, "lock_timeout"},
		{Handler{Options: app.Options{MaxRequestBody: -1}}, "max_request_body"},
		{Handler{Options: app.Options{MaxResponseBody: -1}}, "max_response_body"},
		{Handler{Options: app.Options{OnStoreError: "retry"}}, "on_store_error"},
		{Handler{Options: app.Options{OnConflict: "queue"}}, "on_conflict"},
		{Handler{Options: app.Options{OnConflict: "wait"}}, "max_wait"},
		{Handler{Options: app.Options{OnUnknownOutcome: "forget"}}, "on_unknown_outcome"},
	} {
		h := tc.h
		h.StoreRaw = storeConfigs[0].raw(t)
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("Provision: %v", err)
		}
		if err := h.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want an error naming %s", tc.h, err, tc.want)
		}
		cancel()
	}
}

// Golden adapt tests for every store's options.
func TestAdaptEveryStore(t *testing.T) {
	for _, tc := range []struct{ name, caddyfile, json string }{
		{"memory", `store memory {
			max_entries 5000
			max_bytes   64MiB
		}`, `{
										"max_bytes": 67108864,
										"max_entries": 5000,
										"module": "memory"
									}`},
		{"redis sentinel", `store redis {
			address      10.0.0.1:26379 10.0.0.2:26379
			master_name  mymaster
			dial_timeout 500ms
			read_timeout 250ms
			write_timeout 250ms
			pool_size    64
			min_replicas 1
			replica_timeout 50ms
		}`, `{
										"addresses": [
											"10.0.0.1:26379",
											"10.0.0.2:26379"
										],
										"dial_timeout": 500000000,
										"master_name": "mymaster",
										"min_replicas": 1,
										"module": "redis",
										"pool_size": 64,
										"read_timeout": 250000000,
										"replica_timeout": 50000000,
										"write_timeout": 250000000
									}`},
		{"file", `store file {
			path /var/lib/caddy/idempotency
		}`, `{
										"module": "file",
										"path": "/var/lib/caddy/idempotency"
									}`},
		{"postgres", `store postgres {
			dsn          {env.DATABASE_URL}
			table        api_idempotency
			schema       gateway
			max_conns    8
			create_table off
			synchronous_commit remote_write
		}`, `{
										"create_table": false,
										"dsn": "{env.DATABASE_URL}",
										"max_conns": 8,
										"module": "postgres",
										"schema": "gateway",
										"synchronous_commit": "remote_write",
										"table": "api_idempotency"
									}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caddytest.AssertAdapt(t, ":8080 {\n\tidempotency {\n\t\t"+tc.caddyfile+"\n\t}\n}", "caddyfile", `{
	"apps": {
		"http": {
			"servers": {
				"srv0": {
					"listen": [
						":8080"
					],
					"routes": [
						{
							"handle": [
								{
									"handler": "idempotency",
									"store": `+tc.json+`
								}
							]
						}
					]
				}
			}
		}
	}
}`)
		})
	}
}

// The example a newcomer runs must stay valid: adapted and provisioned.
func TestExampleCaddyfileIsValid(t *testing.T) {
	body, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	cfgJSON, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatalf("adapting Caddyfile.example: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("Caddyfile.example: %s", w)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatalf("Caddyfile.example does not provision: %v", err)
	}
}

// The parser checks the syntax; what a value means is checked once, when
// the config is provisioned: such a config is refused with the option and
// the value named.
func TestOptionValuesCheckedAtProvision(t *testing.T) {
	for _, tc := range []struct{ opts, want string }{
		{"release_statuses 429 200", "release_statuses: want 4xx or 5xx statuses, got 200"},
		{"forward_key X:Bad", `forward_key: invalid header name "X:Bad"`},
		{"fingerprint_headers X-Ok X:Bad", `fingerprint_headers: invalid header name "X:Bad"`},
		{"fingerprint_ignore /sent_at", "fingerprint_ignore applies only with fingerprint json, not body"},
		{"fingerprint json\n\t\tfingerprint_ignore sent_at", "fingerprint_ignore: 'sent_at' is not a JSON pointer (RFC 6901): must start with /"},
		{"fingerprint json\n\t\tfingerprint_ignore /a~2", "~ must be followed by 0 or 1"},
	} {
		site := "{\n\tadmin off\n}\n:9711 {\n\tidempotency {\n\t\t" + tc.opts + "\n\t}\n\trespond ok\n}\n"
		if err := validateCaddyfile(t, site); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.opts, err, tc.want)
		}
		global := "{\n\tadmin off\n\tidempotency {\n\t\t" + tc.opts + "\n\t}\n}\n:9711 {\n\trespond ok\n}\n"
		if err := validateCaddyfile(t, global); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("global %q: error %v, want one containing %q", tc.opts, err, tc.want)
		}
	}
}
