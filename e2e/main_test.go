package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caddyBin is the Caddy binary under test, with the idempotency module.
var caddyBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	version, err := moduleVersion()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	prebuilt := os.Getenv("CADDY_BIN")
	if prebuilt != "" {
		abs, err := filepath.Abs(prebuilt)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: CADDY_BIN=%s: %v\n", prebuilt, err)
			return 1
		}
		caddyBin = abs
		fmt.Fprintf(os.Stderr, "e2e: using prebuilt CADDY_BIN=%s\n", caddyBin)
	} else {
		dir, err := os.MkdirTemp("", "caddy-e2e-build-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: creating build dir: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		caddyBin = filepath.Join(dir, "caddy")
		if err := build(caddyBin, ""); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
	}
	reported, err := checkModules(caddyBin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	// A binary built here must report this tree's version (v0.0.0 only
	// outside git); one built before may come from an earlier commit,
	// which is worth a note, but must name one.
	switch {
	case reported == version:
	case prebuilt == "":
		fmt.Fprintf(os.Stderr, "e2e: %s list-modules reports version %s, ../xcaddy.sh version says %s\n", caddyBin, reported, version)
		return 1
	case reported == "v0.0.0" || reported == "(devel)":
		fmt.Fprintf(os.Stderr, "e2e: %s list-modules --versions reports %s, which names no commit; build it with ../xcaddy.sh\n", caddyBin, reported)
		return 1
	default:
		fmt.Fprintf(os.Stderr, "e2e: note: CADDY_BIN reports version %s, this tree builds as %s\n", reported, version)
	}
	return m.Run()
}

// build runs ../xcaddy.sh with CADDY_OUT=out (and CADDY_VERSION=caddy
// unless empty) and fails with its whole output.
func build(out, caddy string) error {
	script, err := filepath.Abs(filepath.Join("..", "xcaddy.sh"))
	if err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "CADDY_OUT="+out)
	if caddy != "" {
		cmd.Env = append(cmd.Env, "CADDY_VERSION="+caddy)
	}
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("building caddy with %s failed: %v\n----- build output -----\n%s", script, err, output)
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", out, time.Since(start).Round(time.Second))
	return nil
}

// moduleVersion is the version ../xcaddy.sh builds this tree under.
func moduleVersion() (string, error) {
	out, err := exec.Command(filepath.Join("..", "xcaddy.sh"), "version").Output()
	if err != nil {
		return "", fmt.Errorf("../xcaddy.sh version: %v", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// idempotencyModules are the Caddy modules this Go module registers.
var idempotencyModules = []string{"admin.api.idempotency", "http.handlers.idempotency", "idempotency",
	"http.idempotency.stores.memory", "http.idempotency.stores.redis",
	"http.idempotency.stores.file", "http.idempotency.stores.postgres"}

// checkModules makes sure the binary really carries this module, so that a
// stale or foreign CADDY_BIN fails loudly instead of failing every test.
// It returns the one version `list-modules --versions` reports for it.
func checkModules(bin string) (string, error) {
	out, err := exec.Command(bin, "list-modules", "--versions", "--skip-standard").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s list-modules --versions: %v\n%s", bin, err, out)
	}
	versions := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if id, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			versions[id] = version
		}
	}
	var version string
	for _, mod := range idempotencyModules {
		v, ok := versions[mod]
		switch {
		case !ok:
			return "", fmt.Errorf("%s lacks module %s; list-modules says:\n%s", bin, mod, out)
		case v == "":
			return "", fmt.Errorf("%s list-modules --versions reports no version for %s:\n%s", bin, mod, out)
		case version != "" && v != version:
			return "", fmt.Errorf("%s list-modules --versions reports %s and %s for one Go module:\n%s", bin, version, v, out)
		}
		version = v
	}
	return version, nil
}
