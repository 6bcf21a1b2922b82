// Package testredis runs a private redis-server for a test, on a free
// loopback port, so that store tests need no shared Redis and can kill and
// restart the server at will.
package testredis

import (
	"context"
	"net"
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
	args []string

	mu     sync.Mutex
	node   *proc // nil once killed
	client *goredis.Client
}

// Start starts a redis-server without persistence and returns once it
// answers PING. The server is killed when the test ends. A missing binary
// fails the test rather than skipping it: a skipped store test looks green.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with more redis-server arguments, such as
// "--rename-command", "WAIT", "" to take a command away.
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{bin: lookBin(t, "redis-server"), dir: t.TempDir(), args: args}
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
	node, err := startProc(s.bin, s.dir, s.port, serverArgs(s.dir, s.port, s.args...)...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.node = node
	s.mu.Unlock()
	return nil
}

func (s *Server) killLocked() {
	if s.node != nil {
		s.node.kill()
		s.node = nil
	}
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

// waitUntil polls cond until it returns nil, and fails t with cond's last
// error if that takes longer than timeout.
func waitUntil(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testredis: waiting %v for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
