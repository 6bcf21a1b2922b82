package redis

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  Store
	}{
		{`redis`, Store{}},
		{`redis {
			address 10.0.0.1:6379 10.0.0.2:6379
			address 10.0.0.3:6379
			master_name mymaster
			username idem
			password {env.REDIS_PASSWORD}
			db 3
			key_prefix shop
			tls
			dial_timeout 500ms
			read_timeout 1s
			write_timeout 2s
			pool_size 20
			name "orders (eu)"
			local_cache 64MiB
			min_replicas 1
			replica_timeout 50ms
			pipelining off
		}`, Store{
			Name: "orders (eu)", Addresses: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}, MasterName: "mymaster",
			Username: "idem", Password: "{env.REDIS_PASSWORD}", DB: 3, KeyPrefix: "shop", TLS: true,
			DialTimeout: caddy.Duration(500 * time.Millisecond), ReadTimeout: caddy.Duration(time.Second),
			WriteTimeout: caddy.Duration(2 * time.Second), PoolSize: 20, LocalCache: 64 << 20,
			MinReplicas: 1, ReplicaTimeout: caddy.Duration(50 * time.Millisecond), Pipelining: new(bool),
		}},
	} {
		var got Store
		if err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("UnmarshalCaddyfile(%s): %v", tc.input, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("UnmarshalCaddyfile(%s) =\n%#v\nwant\n%#v", tc.input, got, tc.want)
		}
	}

	for _, tc := range []struct{ input, want string }{
		{`redis 127.0.0.1:6379`, "unexpected argument '127.0.0.1:6379'"},
		{"redis {\n bogus 1\n}", "unrecognized subdirective 'bogus'"},
		{"redis {\n pipelining maybe\n}", "pipelining"},
		{"redis {\n address\n}", "address: expected at least one value"},
		{"redis {\n db three\n}", "db: 'three'"},
		{"redis {\n db -1\n}", "db: '-1'"},
		{"redis {\n db 1\n db 2\n}", "db already specified"},
		{"redis {\n pool_size many\n}", "pool_size: 'many'"},
		{"redis {\n password\n}", "password: expected a value"},
		{"redis {\n username a b\n}", "username: unexpected extra argument 'b'"},
		{"redis {\n tls yes\n}", "tls: unexpected argument 'yes'"},
		{"redis {\n name a b\n}", "name: unexpected extra argument 'b'"},
		{"redis {\n dial_timeout soon\n}", "dial_timeout: invalid duration 'soon'"},
		{"redis {\n read_timeout -1s\n}", "read_timeout: invalid duration '-1s'"},
		{"redis {\n write_timeout\n}", "write_timeout"},
		{"redis {\n key_prefix a\n key_prefix b\n}", "key_prefix already specified"},
		{"redis {\n local_cache lots\n}", "local_cache: invalid size 'lots'"},
		{"redis {\n local_cache 0\n}", "local_cache: invalid size '0'"},
		{"redis {\n min_replicas -1\n}", "min_replicas: '-1'"},
		{"redis {\n min_replicas one\n}", "min_replicas: 'one'"},
		{"redis {\n replica_timeout 0s\n}", "replica_timeout"},
		{"redis {\n replica_timeout 1s 2s\n}", "replica_timeout: unexpected extra argument '2s'"},
	} {
		var s Store
		err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("UnmarshalCaddyfile(%q) = %v, want an error containing %q", tc.input, err, tc.want)
		}
	}
}
