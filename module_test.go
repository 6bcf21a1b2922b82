package idempotency

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// notAStore is a module in the stores' namespace that is not a store, as a
// third-party module registered under the wrong namespace would be.
type notAStore struct{}

func init() { caddy.RegisterModule(notAStore{}) }

func (notAStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.not_a_store",
		New: func() caddy.Module { return new(notAStore) },
	}
}

func (*notAStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

// A store module that is not a store is refused where the config names it:
// the Caddyfile as it is parsed, a JSON config when the handler or the
// app loads it.
func TestStoreModuleMustBeAStore(t *testing.T) {
	in := "idempotency {\n store not_a_store\n}"
	err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
	want := "store: module http.idempotency.stores.not_a_store (*idempotency.notAStore) is not an idempotency store, at Testfile:2"
	if err == nil || err.Error() != want {
		t.Errorf("%q: error %v, want %q", in, err, want)
	}

	raw := json.RawMessage(`{"module":"not_a_store"}`)
	for _, tc := range []struct {
		name string
		mod  caddy.Provisioner
		want string
	}{
		{"handler", &Handler{StoreRaw: raw}, "module *idempotency.notAStore is not an idempotency store"},
		{"app", &App{Handler: Handler{StoreRaw: raw}}, "module *idempotency.notAStore is not an idempotency store"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := tc.mod.Provision(ctx); err == nil || err.Error() != tc.want {
			t.Errorf("%s: Provision = %v, want %q", tc.name, err, tc.want)
		}
		cancel()
	}
}
