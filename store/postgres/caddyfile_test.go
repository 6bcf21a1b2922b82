package postgres

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		in      string
		want    Store
		wantErr string
	}{
		{in: "postgres {\n dsn {env.DATABASE_URL}\n}", want: Store{DSN: "{env.DATABASE_URL}"}},
		{
			in:   "postgres {\n dsn \"host=db user=app\"\n table keys\n schema app\n max_conns 8\n create_table off\n}",
			want: Store{DSN: "host=db user=app", Table: "keys", Schema: "app", MaxConns: 8, CreateTable: &off},
		},
		{in: "postgres {\n dsn x\n create_table on\n}", want: Store{DSN: "x", CreateTable: &on}},
		{in: "postgres {\n dsn x\n name \"orders db\"\n}", want: Store{Name: "orders db", DSN: "x"}},
		{in: "postgres {\n dsn x\n name\n}", wantErr: "name: expected a value"},
		{in: "postgres {\n dsn x\n local_cache 64MiB\n}", want: Store{DSN: "x", LocalCache: 64 << 20}},
		{in: "postgres {\n dsn x\n local_cache lots\n}", wantErr: "local_cache: invalid size 'lots'"},
		{in: "postgres {\n dsn x\n local_cache 0\n}", wantErr: "local_cache: invalid size '0'"},
		{in: "postgres {\n dsn x\n local_cache 1MiB\n local_cache 2MiB\n}", wantErr: "local_cache already specified"},
		{in: "postgres {\n dsn x\n synchronous_commit remote_apply\n}", want: Store{DSN: "x", SynchronousCommit: "remote_apply"}},
		{in: "postgres {\n dsn x\n synchronous_commit always\n}", wantErr: "synchronous_commit: want on or off or local or remote_write or remote_apply, got 'always'"},
		{in: "postgres {\n dsn x\n pipelining off\n}", want: Store{DSN: "x", Pipelining: &off}},
		{in: "postgres {\n dsn x\n pipelining on\n}", want: Store{DSN: "x", Pipelining: &on}},
		{in: "postgres {\n dsn x\n pipelining maybe\n}", wantErr: "pipelining: want on or off, got 'maybe'"},
		{in: "postgres {\n dsn x\n pipelining off\n pipelining on\n}", wantErr: "pipelining already specified"},
		{in: `postgres`, wantErr: "dsn: a connection string is required"},
		{in: `postgres postgres://db`, wantErr: "unexpected argument 'postgres://db'"},
		{in: "postgres {\n dsn\n}", wantErr: "dsn: expected a value"},
		{in: "postgres {\n dsn a b\n}", wantErr: "dsn: unexpected extra argument 'b'"},
		{in: "postgres {\n dsn a\n dsn b\n}", wantErr: "dsn already specified"},
		{in: "postgres {\n dsn a\n max_conns 0\n}", wantErr: "max_conns: '0' is not a positive integer"},
		{in: "postgres {\n dsn a\n max_conns many\n}", wantErr: "max_conns: 'many'"},
		{in: "postgres {\n dsn a\n create_table yes\n}", wantErr: "create_table: want on or off, got 'yes'"},
		{in: "postgres {\n dsn a\n table\n}", wantErr: "table: expected a value"},
		{in: "postgres {\n dsn a\n color blue\n}", wantErr: "unrecognized subdirective 'color'"},
	} {
		var got Store
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.String() != tc.want.String() || (got.CreateTable == nil) != (tc.want.CreateTable == nil) ||
			(got.Pipelining == nil) != (tc.want.Pipelining == nil) {
			t.Errorf("%q: got %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
