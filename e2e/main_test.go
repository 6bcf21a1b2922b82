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
	if bin := os.Getenv("CADDY_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: CADDY_BIN=%s: %v\n", bin, err)
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
		if err := build(caddyBin); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
	}
	if err := checkModules(caddyBin); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	return m.Run()
}

// build runs ../xcaddy.sh with CADDY_OUT=out and fails with its whole
// output.
func build(out string) error {
	script, err := filepath.Abs(filepath.Join("..", "xcaddy.sh"))
	if err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "CADDY_OUT="+out)
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("building caddy with %s failed: %v\n----- build output -----\n%s", script, err, output)
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", out, time.Since(start).Round(time.Second))
	return nil
}

// checkModules makes sure the binary really carries this module, so that a
// stale or foreign CADDY_BIN fails loudly instead of failing every test.
func checkModules(bin string) error {
	out, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s list-modules: %v\n%s", bin, err, out)
	}
	for _, mod := range []string{"http.handlers.idempotency", "http.idempotency.stores.memory", "http.idempotency.stores.redis",
		"http.idempotency.stores.file", "http.idempotency.stores.postgres"} {
		if !strings.Contains(string(out), mod) {
			return fmt.Errorf("%s lacks module %s; list-modules says:\n%s", bin, mod, out)
		}
	}
	return nil
}
