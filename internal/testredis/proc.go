package testredis

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// proc is one redis-server process (a single server, a cluster node, a
// Sentinel) owned by a test, killed when the test ends.
type proc struct {
	port int
	log  string // the process's output

	mu      sync.Mutex
	process *testproc.Proc // nil once killed
}

func (p *proc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// startProc runs redis-server with args in dir and waits until it answers
// PING on port.
func startProc(bin, dir string, port int, args ...string) (*proc, error) {
	p := &proc{port: port, log: filepath.Join(dir, "redis.log")}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	var err error
	p.process, err = testproc.Start(cmd, p.log, testproc.Ready{
		Check:   func() error { return ping(p.addr()) },
		What:    "answer PING on " + p.addr(),
		Timeout: 10 * time.Second,
		Poll:    20 * time.Millisecond,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// serverArgs are the arguments of a redis-server on port that keeps its
// files in dir and persists nothing, followed by more.
func serverArgs(dir string, port int, more ...string) []string {
	return append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
	}, more...)
}

// kill sends SIGKILL and waits for the process to exit.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.process == nil {
		return
	}
	p.process.Kill()
	p.process = nil
}

// signal sends sig to the process, if it still runs.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.process == nil {
		return fmt.Errorf("process on port %d was killed", p.port)
	}
	return syscall.Kill(p.process.Pid(), sig)
}

func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.process != nil
}

func lookBin(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		bin, err = exec.LookPath("/usr/bin/" + name)
	}
	if err != nil {
		t.Fatalf("testredis: %s not found (install the redis-server and redis-tools packages): %v", name, err)
	}
	return bin
}

// ping speaks raw RESP so that readiness does not depend on client pools.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "+PONG\r\n" {
		return fmt.Errorf("unexpected reply %q", buf[:n])
	}
	return nil
}

// lastLog is the end of the process's output, to explain a failure.
func (p *proc) lastLog(lines int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return testproc.LastLines(string(b), lines)
}
