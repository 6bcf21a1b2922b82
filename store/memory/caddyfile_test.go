package memory

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Memory
		wantErr string
	}{
		{in: `memory`, want: Memory{}},
		{in: "memory {\n max_entries 10\n max_bytes 1MiB\n}", want: Memory{MaxEntries: 10, MaxBytes: 1 << 20}},
		{in: "memory {\n name \"local cache\"\n}", want: Memory{Name: "local cache"}},
		{in: "memory {\n name\n}", wantErr: "name: expected a value"},
		{in: "memory {\n name a\n name b\n}", wantErr: "name already specified"},
		{in: `memory extra`, wantErr: "unexpected argument 'extra'"},
		{in: "memory {\n max_entries -1\n}", wantErr: "max_entries: '-1' is not a positive integer"},
		{in: "memory {\n max_bytes lots\n}", wantErr: "max_bytes: invalid size 'lots'"},
		{in: "memory {\n max_entries 1\n max_entries 2\n}", wantErr: "max_entries already specified"},
		{in: "memory {\n color blue\n}", wantErr: "unrecognized subdirective 'color'"},
	} {
		var got Memory
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.MaxEntries != tc.want.MaxEntries || got.MaxBytes != tc.want.MaxBytes || got.Name != tc.want.Name {
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// The table numbers its slots in an int32: a bound past what it can hold
// is refused, not quietly lowered.
func TestValidateRefusesMoreEntriesThanATableHolds(t *testing.T) {
	if err := (&Memory{MaxEntries: table.MaxEntries}).Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (&Memory{MaxEntries: table.MaxEntries + 1}).Validate(); err == nil {
		t.Fatal("Validate passed more entries than a table holds")
	}
}
