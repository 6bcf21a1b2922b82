package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// coreTests are the end-to-end tests every supported Caddy release must
// pass: the first request, its replay, 400 and 422 (memory store), 409
// to concurrent duplicates (memory and Redis), two instances on one Redis.
// The last two pin what the handler reads of reverse_proxy (outcome.go):
// its upstream placeholder set once an upstream is selected, and a
// DialError when none could be reached; they fail if a Caddy changes it.
var coreTests = []string{"TestMemoryStoreProtocol", "TestConcurrentDuplicates", "TestTwoInstancesShareRedis",
	"TestUnknownOutcomeConnectionClosed", "TestClosedPortThenOpen"}

// The oldest Caddy the module supports is the one go.mod requires (a
// newer one is the user's choice at build time). The rest of this package
// runs on the newest, ../xcaddy.sh's default; this runs the core tests
// again, in a child test process, on a binary built with the oldest:
// CADDY_BIN_OLDEST, or one built here when that is unset.
func TestCoreOnOldestCaddy(t *testing.T) {
	t.Parallel()
	oldest := requiredCaddy(t)
	bin := os.Getenv("CADDY_BIN_OLDEST")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "caddy-oldest")
		if err := build(bin, oldest); err != nil {
			t.Fatal(err)
		}
	} else if abs, err := filepath.Abs(bin); err != nil {
		t.Fatalf("CADDY_BIN_OLDEST=%s: %v", bin, err)
	} else {
		bin = abs
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	if got, _, _ := strings.Cut(strings.TrimSpace(string(out)), " "); got != oldest {
		t.Fatalf("%s is Caddy %s; go.mod requires %s, the oldest supported", bin, got, oldest)
	}

	args := []string{"-test.run", "^(" + strings.Join(coreTests, "|") + ")$", "-test.count=1", "-test.v"}
	if deadline, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout", time.Until(deadline).Round(time.Second).String())
	}
	child := exec.Command(os.Args[0], args...)
	child.Env = append(os.Environ(), "CADDY_BIN="+bin, "CADDY_BIN_OLDEST=")
	out, err = child.CombinedOutput()
	if err != nil {
		t.Fatalf("core tests on Caddy %s: %v\n%s", oldest, err, out)
	}
	for _, name := range coreTests {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Fatalf("core test %s did not run on Caddy %s:\n%s", name, oldest, out)
		}
	}
	t.Logf("core tests pass on Caddy %s (%s)", oldest, bin)
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}

// requiredCaddy is the Caddy release go.mod requires.
func requiredCaddy(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/caddyserver/caddy/v2").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/caddyserver/caddy/v2: %v", err)
	}
	return strings.TrimSpace(string(out))
}
