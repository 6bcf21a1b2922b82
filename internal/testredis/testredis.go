// Package testredis runs a private redis-server for a test, on a free
// loopback port, so that store tests need no shared Redis and can kill and
// restart the server at will.
package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// Server is one redis-server process owned by a test.
type Server struct {
	bin  string
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	client *goredis.Client
}

// Start starts a redis-server without persistence and returns once it
// answers PING. The server is killed when the test ends. A missing binary
// fails the test rather than skipping it: a skipped store test looks green.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin, err = exec.LookPath("/usr/bin/redis-server")
	}
	if err != nil {
		t.Fatalf("testredis: redis-server not found (install the redis-server package): %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir()}
	t.Cleanup(s.close)

	if _, err := testproc.OnFreePort(func(port int) error { s.port = port; return s.start() }); err != nil {
		t.Fatalf("testredis: starting redis-server: %v", err)
	}
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Kill sends SIGKILL to the server and waits for it to exit, like a crash.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Restart starts a new, empty server on the same port after Kill.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	// The old socket may linger for a moment after the kill.
	if err := testproc.Retry(20, 50*time.Millisecond, s.start); err != nil {
		t.Fatalf("testredis: restarting redis-server on port %d: %v", s.port, err)
	}
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client() *goredis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		s.client = goredis.NewClient(&goredis.Options{Addr: s.Addr(), DisableIdentity: true})
	}
	return s.client
}

// ConfigResetStat zeroes the server's command statistics.
func (s *Server) ConfigResetStat(t testing.TB) {
	t.Helper()
	if err := s.Client().ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatalf("testredis: CONFIG RESETSTAT: %v", err)
	}
}

// CommandStats returns how many times each command ran since the last
// ConfigResetStat, keyed by lowercase name ("set", "evalsha", ...).
// Redis counts the commands a script calls as well as the script itself.
func (s *Server) CommandStats(t testing.TB) map[string]int64 {
	t.Helper()
	info, err := s.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("testredis: INFO commandstats: %v", err)
	}
	stats := make(map[string]int64)
	for line := range strings.Lines(info) {
		// cmdstat_set:calls=2,usec=13,usec_per_call=6.50,rejected_calls=0,failed_calls=0
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		for field := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("testredis: parsing commandstats line %q: %v", line, err)
				}
				stats[name] = n
			}
		}
	}
	return stats
}

// start runs the server on s.port and waits until it answers PING.
func (s *Server) start() error {
	logPath := filepath.Join(s.dir, "redis.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("creating log file: %w", err)
	}
	defer logFile.Close()

	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(s.Addr()) == nil {
			return nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("redis-server exited early: %s", lastLines(string(out), 5))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server did not answer PING on %s within 10s", s.Addr())
		}
	}
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

func (s *Server) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
	s.killLocked()
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

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
