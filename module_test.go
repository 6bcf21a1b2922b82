package idempotency

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/store"
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
		{"handler", &Handler{Options: app.Options{StoreRaw: raw}}, "module *idempotency.notAStore is not an idempotency store"},
		{"app", &app.App{Options: app.Options{StoreRaw: raw}}, "module *idempotency.notAStore is not an idempotency store"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := tc.mod.Provision(ctx); err == nil || err.Error() != tc.want {
			t.Errorf("%s: Provision = %v, want %q", tc.name, err, tc.want)
		}
		cancel()
	}
}

// Within one config a memory store's name stands for one table, with one
// set of limits: a name given two limits is a config error, not a silent
// merge. Stores that share a name share its table and registration; two
// names are two tables.
func TestStoreNamesInOneConfig(t *testing.T) {
	site := func(a, b string) string {
		return "{\n\tadmin off\n}\n:9700 {\n\thandle /a* {\n\t\tidempotency {\n\t\t\tstore memory {\n" + a +
			"\n\t\t\t}\n\t\t}\n\t\trespond a\n\t}\n\thandle {\n\t\tidempotency {\n\t\t\tstore memory {\n" + b +
			"\n\t\t\t}\n\t\t}\n\t\trespond b\n\t}\n}\n"
	}
	for _, tc := range []struct{ what, caddyfile, want string }{
		{"one name, two limits", site("max_entries 9701\nname ledger", "max_entries 9702\nname ledger"),
			"store name 'ledger' is already given to other records in this config (memory table 'ledger' of 970"},
		{"no name, two limits", site("max_entries 9703", "max_entries 9704"),
			"store name 'memory' is already given to other records in this config (memory table 'memory' of 970"},
		{"one name, one limit", site("max_entries 9707\nname ledger", "max_entries 9707\nname ledger"), ""},
		{"two names, one limit: two tables", site("max_entries 9708\nname ledger", "max_entries 9708\nname refunds"), ""},
		{"two names, two limits", site("max_entries 9708\nname ledger", "max_entries 9709\nname refunds"), ""},
	} {
		err := validateCaddyfile(t, tc.caddyfile)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.what, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.what, err, tc.want)
		}
	}
	for _, r := range store.Registered() {
		if strings.Contains(r.Name, "(970") || r.Name == "ledger" || r.Name == "refunds" {
			t.Errorf("%s is still registered after its config was validated", r.Name)
		}
	}
}

// validateCaddyfile adapts a Caddyfile and provisions it as one config,
// without starting it, as `caddy validate` does.
func validateCaddyfile(t *testing.T, in string) error {
	t.Helper()
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), nil)
	if err != nil {
		t.Fatalf("adapting %s: %v", in, err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}

// Importing the handler's package, as xcaddy does, registers every module
// of the plugin and its command: `caddy list-modules` lists them all.
func TestEveryModuleRegistered(t *testing.T) {
	for _, id := range []string{
		"http.handlers.idempotency", "idempotency", "admin.api.idempotency",
		"http.idempotency.stores.memory", "http.idempotency.stores.redis",
		"http.idempotency.stores.file", "http.idempotency.stores.postgres",
	} {
		if _, err := caddy.GetModule(id); err != nil {
			t.Errorf("module %s: %v", id, err)
		}
	}
	if _, ok := caddycmd.Commands()["idempotency"]; !ok {
		t.Error("the idempotency command is not registered")
	}
}
