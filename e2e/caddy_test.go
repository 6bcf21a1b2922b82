package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// caddyProc is one caddy process run by a test.
type caddyProc struct {
	t         testing.TB
	name      string
	Addr      string // host:port of the site
	URL       string // http://Addr
	logPath   string
	port      int
	adminPort int
	cmd       *exec.Cmd
	exited    chan struct{} // closed once the process has been waited for
	killed    bool          // by Kill: an exit the test asked for
}

// startCaddy runs the caddy binary with a Caddyfile whose one site, on a
// free loopback port, holds the directives in site. It returns once the
// server serves, and stops it with SIGTERM when the test ends; the process
// output is printed if the test failed.
func startCaddy(t testing.TB, name, site string) *caddyProc {
	t.Helper()
	return startCaddyEnv(t, name, site, nil)
}

// startCaddyEnv is startCaddy with env (NAME=value) added to the
// process's environment.
func startCaddyEnv(t testing.TB, name, site string, env []string) *caddyProc {
	t.Helper()
	dir := t.TempDir()
	// A port probed free may be taken before caddy binds it: try again.
	for attempt := 1; ; attempt++ {
		c, err := tryStartCaddy(t, dir, name, site, env, attempt)
		if err == nil {
			return c
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatalf("starting caddy %s: %v", name, err)
		}
		t.Logf("caddy %s: port taken, retrying: %v", name, err)
	}
}

var errPortTaken = errors.New("address already in use")

func tryStartCaddy(t testing.TB, dir, name, site string, env []string, attempt int) (*caddyProc, error) {
	t.Helper()
	port, adminPort := freePort(t), freePort(t)
	caddyfile := makeCaddyfile(port, adminPort, site)
	cfgPath := filepath.Join(dir, fmt.Sprintf("Caddyfile.%d", attempt))
	if err := os.WriteFile(cfgPath, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &caddyProc{
		t:         t,
		name:      name,
		Addr:      net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		port:      port,
		adminPort: adminPort,
		logPath:   filepath.Join(dir, fmt.Sprintf("caddy.%d.log", attempt)),
		exited:    make(chan struct{}),
	}
	c.URL = "http://" + c.Addr
	logFile, err := os.Create(c.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	c.cmd = exec.Command(caddyBin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	c.cmd.Dir = dir
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.Env = append(os.Environ(),
		"HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	c.cmd.Env = append(c.cmd.Env, env...)
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("running %s: %v", caddyBin, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if !c.killed && c.Exited() {
			t.Errorf("caddy %s died during the test (%v)", c.name, c.cmd.ProcessState)
		}
		c.stop()
		if t.Failed() {
			c.printLog()
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-c.exited:
			out, _ := os.ReadFile(c.logPath)
			if bytes.Contains(out, []byte("address already in use")) {
				return nil, fmt.Errorf("%w:\n%s", errPortTaken, out)
			}
			return nil, fmt.Errorf("caddy exited during startup (%v); Caddyfile:\n%s\noutput:\n%s", c.cmd.ProcessState, caddyfile, out)
		case <-time.After(20 * time.Millisecond):
		}
		if c.ready() {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("caddy did not serve on %s within 30s", c.Addr)
		}
	}
}

// makeCaddyfile is the whole Caddyfile of a test instance: the admin API
// and one site on loopback ports, no automatic HTTPS, access logs on
// stderr, and a short grace period so that stopping is quick.
func makeCaddyfile(port, adminPort int, site string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	grace_period 1s
	default_bind 127.0.0.1
}

http://:%d {
	log {
		output stderr
	}
%s
}
`, adminPort, port, indent(site))
}

// Reload replaces the site's directives through the admin API, as
// 'caddy reload' does. Caddy answers once the old configuration stopped,
// which waits for its requests up to the grace period.
func (c *caddyProc) Reload(site string) error {
	return c.Load(makeCaddyfile(c.port, c.adminPort, site))
}

// Load replaces the whole Caddyfile through the admin API.
func (c *caddyProc) Load(caddyfile string) error {
	r, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/load", c.adminPort), strings.NewReader(caddyfile))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "text/caddyfile")
	res, err := do(&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 30 * time.Second}, r)
	if err != nil {
		return fmt.Errorf("reloading caddy %s: %w", c.name, err)
	}
	if res.Status != http.StatusOK {
		return fmt.Errorf("reloading caddy %s: %s", c.name, res)
	}
	return nil
}

// ready reports whether caddy has logged that it serves its configuration
// and accepts connections on the site's port.
func (c *caddyProc) ready() bool {
	out, err := os.ReadFile(c.logPath)
	if err != nil || !bytes.Contains(out, []byte("serving initial configuration")) {
		return false
	}
	conn, err := net.DialTimeout("tcp", c.Addr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// Kill sends SIGKILL, like a crash or an OOM kill, and waits for the exit.
func (c *caddyProc) Kill() {
	c.t.Helper()
	select {
	case <-c.exited:
		c.t.Fatalf("caddy %s had already exited before Kill", c.name)
	default:
	}
	c.killed = true
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("killing caddy %s: %v", c.name, err)
	}
	<-c.exited
}

// Exited reports whether the process has exited.
func (c *caddyProc) Exited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// wantAlive fails the test if the process has exited.
func (c *caddyProc) wantAlive(when string) {
	c.t.Helper()
	if c.Exited() {
		c.t.Fatalf("caddy %s died %s (%v)", c.name, when, c.cmd.ProcessState)
	}
}

// stop ends the process gracefully with SIGTERM, and with SIGKILL if it
// does not exit within 5s.
func (c *caddyProc) stop() {
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		c.t.Logf("caddy %s did not exit 5s after SIGTERM; killing it", c.name)
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	}
}

// Log returns what the process has written so far.
func (c *caddyProc) Log() string {
	out, _ := os.ReadFile(c.logPath)
	return string(out)
}

func (c *caddyProc) printLog() {
	const max = 64 << 10
	out := c.Log()
	if len(out) > max {
		out = "[...]\n" + out[len(out)-max:]
	}
	c.t.Logf("----- caddy %s output (%s) -----\n%s----- end of caddy %s output -----", c.name, c.logPath, out, c.name)
}

func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(strings.TrimSpace(s)) {
		b.WriteString("\t")
		b.WriteString(line)
	}
	return b.String()
}

// freePort returns a loopback port that is free and reserved for the rest
// of the test. Caddy binds with SO_REUSEPORT, so two caddy processes given
// the same port would both serve it, silently sharing its connections: a
// port is therefore reserved with an abstract unix socket named after it,
// which other tests, in this process or in another e2e test process, cannot
// bind while it is held.
func freePort(t testing.TB) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		reserved := reservePort(t, port)
		l.Close()
		if reserved {
			return port
		}
	}
	t.Fatal("finding a free port: every port found was reserved by another test")
	return 0
}

func reservePort(t testing.TB, port int) bool {
	if runtime.GOOS != "linux" {
		return true // no abstract sockets: rely on the kernel's choice
	}
	lock, err := net.Listen("unix", fmt.Sprintf("@caddy-idempotency-e2e-port-%d", port))
	if err != nil {
		return false
	}
	t.Cleanup(func() { lock.Close() })
	return true
}
