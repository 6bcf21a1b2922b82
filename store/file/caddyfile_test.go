package file

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
		wantName          string
	}{
		{in: "file {\n name local\n path /srv\n}", want: "/srv", wantName: "local"},
		{in: "file {\n name\n}", wantErr: "name: expected a value"},
		{in: `file`, want: ""},
		{in: "file {\n path /var/lib/caddy/idem\n}", want: "/var/lib/caddy/idem"},
		{in: "file {\n path {env.STATE_DIRECTORY}\n}", want: "{env.STATE_DIRECTORY}"},
		{in: `file /tmp`, wantErr: "unexpected argument '/tmp'"},
		{in: "file {\n path\n}", wantErr: "path: expected a value"},
		{in: "file {\n path a b\n}", wantErr: "path: unexpected extra argument 'b'"},
		{in: "file {\n path a\n path b\n}", wantErr: "path already specified"},
		{in: "file {\n color blue\n}", wantErr: "unrecognized subdirective 'color'"},
	} {
		var got Store
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.Path != tc.want || got.Name != tc.wantName {
			t.Errorf("%q: got path %q, name %q, %v; want %q, %q", tc.in, got.Path, got.Name, err, tc.want, tc.wantName)
		}
	}
}
