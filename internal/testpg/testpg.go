// Package testpg runs a private PostgreSQL server for tests, in a temporary
// directory on a free loopback port, so that store tests need no shared
// database and can kill and restart the server at will.
package testpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// Server is one PostgreSQL cluster and its postmaster, owned by a test.
type Server struct {
	bin  string // directory of initdb and postgres
	base string // temporary directory holding data/ and the log
	port int
	cred *syscall.Credential // non-nil when running as root

	mu         sync.Mutex
	postmaster *testproc.Proc // nil once killed
}

// Start creates and starts a server that is removed when the test ends. A
// missing PostgreSQL fails the test rather than skipping it: a skipped store
// test looks green.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatalf("testpg: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New creates and starts a server; the caller must Close it. It is for a
// TestMain that shares one server among the tests of a package.
func New() (*Server, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if err := s.initdb(); err != nil {
		s.Close()
		return nil, err
	}
	if _, err := testproc.OnFreePort(func(port int) error { s.port = port; return s.start() }); err != nil {
		s.Close()
		return nil, fmt.Errorf("starting postgres: %w", err)
	}
	return s, nil
}

// DSN is a connection string for the server's postgres database.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", s.Addr())
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Kill sends SIGKILL to the postmaster and all its backends and waits for
// them to exit, like a crash of the database host.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Restart starts the server again on the same port and data directory
// after Kill; PostgreSQL runs crash recovery, so committed data survives.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	// Backends of the killed postmaster may still be exiting, holding its
	// shared memory for a moment; postgres refuses to start until they are.
	if err := testproc.Retry(50, 100*time.Millisecond, s.start); err != nil {
		t.Fatalf("testpg: restarting postgres on port %d: %v", s.port, err)
	}
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.Kill()
	if s.base != "" {
		_ = os.RemoveAll(s.base)
	}
}

// findBinaries returns the directory that holds initdb and postgres: the
// one on PATH, else the newest Debian-style /usr/lib/postgresql/*/bin.
func findBinaries() (string, error) {
	var dirs []string
	candidates := []string{"/usr/local/bin/initdb"}
	if p, err := exec.LookPath("initdb"); err == nil {
		candidates = append([]string{p}, candidates...)
	}
	// initdb is often a symlink (Debian's /usr/local/bin, pg_wrapper): the
	// postgres that matches it sits beside its target.
	for _, p := range candidates {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(globbed, func(i, j int) bool { return version(globbed[i]) > version(globbed[j]) })
	dirs = append(dirs, globbed...)
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("initdb and postgres not found on PATH nor in /usr/lib/postgresql/*/bin (install the postgresql package)")
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// initdb creates the cluster. PostgreSQL refuses to run as root, so as root
// both initdb and the server run as the 'postgres' user, which must be able
// to reach and own the data directory.
func (s *Server) initdb() error {
	base, err := os.MkdirTemp("", "testpg-")
	if err != nil {
		return fmt.Errorf("creating a temporary directory: %w", err)
	}
	s.base = base
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root, PostgreSQL needs a 'postgres' user to run as: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chmod(base, 0o711); err != nil {
			return err
		}
		if err := os.Chown(data, int(uid), int(gid)); err != nil {
			return err
		}
	}
	cmd := exec.Command(filepath.Join(s.bin, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
		"-N", // no fsync: the cluster is thrown away with the test
	)
	cmd.Dir = base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, testproc.LastLines(string(out), 5))
	}
	return nil
}

// start runs the postmaster on s.port and waits until it accepts a session.
func (s *Server) start() error {
	data := filepath.Join(s.base, "data")
	cmd := exec.Command(filepath.Join(s.bin, "postgres"),
		"-D", data,
		"-p", strconv.Itoa(s.port),
		"-k", data,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", // a kill of the server keeps the OS cache; only an OS crash would lose data
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
	)
	cmd.Dir = s.base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	p, err := testproc.Start(cmd, filepath.Join(s.base, "postgres.log"), testproc.Ready{
		Check:   func() error { return ready(s.DSN()) },
		What:    "accept sessions on " + s.Addr(),
		Timeout: 30 * time.Second,
		Poll:    25 * time.Millisecond,
		Kill:    killTree,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.postmaster = p
	s.mu.Unlock()
	return nil
}

func (s *Server) killLocked() {
	if s.postmaster == nil {
		return
	}
	killTree(s.postmaster)
	s.postmaster = nil
}

// killTree kills the postmaster and its children. Each backend makes
// itself a process group leader, so killing the postmaster's group is not
// enough, and a backend that outlives its postmaster goes on answering its
// client for a moment: the postmaster is stopped first, so that it forks no
// more, and every child is killed with it.
func killTree(postmaster *testproc.Proc) {
	pid := postmaster.Pid()
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	children := childrenOf(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	postmaster.Wait()
	// Orphans are reaped by init, not us: wait until none runs, so that
	// their sockets are closed and a restart finds the shared memory free.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		alive := false
		for _, c := range children {
			if running(c) {
				alive = true
			}
		}
		if !alive {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var children []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(child); ok && ppid == pid {
			children = append(children, child)
		}
	}
	return children
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// procStat reads the state and parent of pid. The command name in the
// stat line may hold spaces and parentheses, so fields count from its end.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	rest := string(b)
	i := strings.LastIndexByte(rest, ')')
	if i < 0 {
		return "", 0, false
	}
	fields := strings.Fields(rest[i+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	return fields[0], ppid, err == nil
}

// ready opens and closes one session; it fails while the server starts up.
func ready(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
