package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// SentinelOptions describes a Sentinel group for StartSentinelWith.
type SentinelOptions struct {
	// Sentinels is the number of Sentinel processes; default 1. The
	// quorum is a majority of them.
	Sentinels int
	// DownAfter is down-after-milliseconds: how long the master may be
	// silent before a Sentinel thinks it down. Default 500ms.
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout. Default 10s. Among
	// other things, Sentinel waits that long before it repoints a replica
	// that replicates from an address it does not know as the master's.
	FailoverTimeout time.Duration
	// ReplicaSource, when set, gives the address the replica replicates
	// from, given the master's: a test may return a faultproxy in front of
	// the master to control the replication link.
	ReplicaSource func(masterAddr string) string
}

// Sentinel is a Redis master, one replica and the Sentinels that watch
// them, as local processes owned by a test.
type Sentinel struct {
	opts      SentinelOptions
	data      [2]*proc // the initial master, then the initial replica
	sentinels []*proc
	clients   sync.Map // address -> *goredis.Client
}

const sentinelMaster = "mymaster"

// StartSentinel starts a master, a replica of it and one Sentinel that
// monitors them with a quorum of 1, and returns once the Sentinel knows
// the replica (so a failover can happen). The processes are killed when
// the test ends; a missing redis-server fails the test.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return StartSentinelWith(t, SentinelOptions{})
}

// StartSentinelBehindLink starts a Sentinel group whose replica
// replicates through a fault proxy, returned, so that a test can cut the
// replication link. Sentinel repoints a replica whose source is not the
// master's address only after failover-timeout, here a minute: long after
// the test.
func StartSentinelBehindLink(t testing.TB) (*Sentinel, *faultproxy.Proxy) {
	var link *faultproxy.Proxy
	sg := StartSentinelWith(t, SentinelOptions{
		FailoverTimeout: time.Minute,
		ReplicaSource: func(master string) string {
			link = faultproxy.Start(t, master)
			return link.Addr()
		},
	})
	return sg, link
}

// StartSentinelWith starts the group that opts describes.
func StartSentinelWith(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	if opts.Sentinels == 0 {
		opts.Sentinels = 1
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = 500 * time.Millisecond
	}
	if opts.FailoverTimeout == 0 {
		opts.FailoverTimeout = 10 * time.Second
	}
	bin := lookBin(t, "redis-server")
	s := &Sentinel{opts: opts}
	t.Cleanup(s.close)

	master, err := startWithPort(t, func(dir string, port int) (*proc, error) {
		return startProc(bin, dir, port, dataArgs(dir, port)...)
	})
	if err != nil {
		t.Fatalf("testredis: starting the master: %v", err)
	}
	s.data[0] = master
	source := master.addr()
	if opts.ReplicaSource != nil {
		source = opts.ReplicaSource(source)
	}
	host, port, err := net.SplitHostPort(source)
	if err != nil {
		t.Fatalf("testredis: replica source %q: %v", source, err)
	}
	replica, err := startWithPort(t, func(dir string, p int) (*proc, error) {
		return startProc(bin, dir, p, append(dataArgs(dir, p), "--replicaof", host, port)...)
	})
	if err != nil {
		t.Fatalf("testredis: starting the replica: %v", err)
	}
	s.data[1] = replica
	waitUntil(t, "the replica to sync", 10*time.Second, func() error {
		info, err := s.client(replica.addr()).Info(context.Background(), "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replication link not up")
		}
		return nil
	})

	quorum := opts.Sentinels/2 + 1
	for i := range opts.Sentinels {
		sp, err := startWithPort(t, func(dir string, p int) (*proc, error) {
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
				"sentinel monitor %s 127.0.0.1 %d %d\n"+
				"sentinel down-after-milliseconds %[3]s %[6]d\n"+
				"sentinel failover-timeout %[3]s %[7]d\n"+
				"sentinel parallel-syncs %[3]s 1\n",
				p, dir, sentinelMaster, master.port, quorum,
				startupDownAfter.Milliseconds(), opts.FailoverTimeout.Milliseconds())
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			return startProc(bin, dir, p, conf, "--sentinel")
		})
		if err != nil {
			t.Fatalf("testredis: starting sentinel %d: %v", i, err)
		}
		// A Sentinel that was not scheduled for 2s (a loaded CI machine)
		// enters TILT mode and does nothing for 30s: a failover then
		// starts after the test has stopped waiting for it. The tests
		// test our client, not Sentinel's defence against a slow host.
		if err := s.client(sp.addr()).Do(context.Background(),
			"SENTINEL", "DEBUG", "tilt-trigger", 15000, "tilt-period", 1000).Err(); err != nil {
			t.Fatalf("testredis: tuning sentinel %d's TILT mode: %v", i, err)
		}
		s.sentinels = append(s.sentinels, sp)
	}
	s.WaitReady(t)
	for i, sp := range s.sentinels {
		if err := s.client(sp.addr()).Do(context.Background(), "SENTINEL", "SET", sentinelMaster,
			"down-after-milliseconds", opts.DownAfter.Milliseconds()).Err(); err != nil {
			t.Fatalf("testredis: setting sentinel %d's down-after-milliseconds: %v", i, err)
		}
	}
	return s
}

// startupDownAfter is the down-after-milliseconds a Sentinel starts with,
// until WaitReady has seen it connected: its link to the master counts as
// down from the Sentinel's start, and a Sentinel whose first timer tick
// came late (CI: 700ms after start, behind its first fsync of its config)
// found the master down before it ever connected, tried a failover at once,
// aborted it for want of a replica it had not met yet, and then would not
// try again for twice failover-timeout: longer than any test waits.
const startupDownAfter = 30 * time.Second

func dataArgs(dir string, port int) []string {
	return serverArgs(dir, port, "--repl-diskless-sync-delay", "0")
}

// startWithPort retries start on another free port when the one it probed
// was taken in the meantime.
func startWithPort(t testing.TB, start func(dir string, port int) (*proc, error)) (*proc, error) {
	var p *proc
	_, err := testproc.OnFreePort(func(port int) error {
		dir, err := os.MkdirTemp(t.TempDir(), "redis")
		if err != nil {
			return err
		}
		p, err = start(dir, port)
		return err
	})
	return p, err
}

// MasterName is the name the Sentinels know the master by.
func (s *Sentinel) MasterName() string { return sentinelMaster }

// SentinelAddrs are the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, p := range s.sentinels {
		addrs[i] = p.addr()
	}
	return addrs
}

// InitialMasterAddr and InitialReplicaAddr are the addresses of the two
// data nodes as started, whatever their roles now.
func (s *Sentinel) InitialMasterAddr() string  { return s.data[0].addr() }
func (s *Sentinel) InitialReplicaAddr() string { return s.data[1].addr() }

// Client is a plain client of one node (data node or Sentinel), closed
// when the test ends.
func (s *Sentinel) Client(addr string) *goredis.Client { return s.client(addr) }

func (s *Sentinel) client(addr string) *goredis.Client {
	if cl, ok := s.clients.Load(addr); ok {
		return cl.(*goredis.Client)
	}
	cl := goredis.NewClient(&goredis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	if prev, loaded := s.clients.LoadOrStore(addr, cl); loaded {
		cl.Close()
		return prev.(*goredis.Client)
	}
	return cl
}

// MasterAddr is the master's address as the first live Sentinel reports it.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	for _, sp := range s.sentinels {
		if !sp.alive() {
			continue
		}
		addr, err := s.masterFrom(sp)
		if err != nil {
			t.Fatalf("testredis: SENTINEL get-master-addr-by-name: %v", err)
		}
		return addr
	}
	t.Fatal("testredis: no live sentinel")
	return ""
}

func (s *Sentinel) masterFrom(sp *proc) (string, error) {
	hp, err := s.client(sp.addr()).Do(context.Background(),
		"SENTINEL", "get-master-addr-by-name", sentinelMaster).StringSlice()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("unexpected reply %q", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// WaitReady waits until every Sentinel reports the master reachable with
// a reachable quorum (SENTINEL CKQUORUM), sees it up and not failing over
// (its flags are "master" alone), knows the replica, and knows every
// other Sentinel.
func (s *Sentinel) WaitReady(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, "the sentinels to be ready", 20*time.Second, func() error {
		for i, sp := range s.sentinels {
			c := s.client(sp.addr())
			if err := c.Do(ctx, "SENTINEL", "CKQUORUM", sentinelMaster).Err(); err != nil {
				return fmt.Errorf("sentinel %d: %w", i, err)
			}
			// the command go-redis's SentinelClient.Master sends, whose
			// reply type reads RESP2's flat list and RESP3's map alike
			master := goredis.NewMapStringStringCmd(ctx, "SENTINEL", "MASTER", sentinelMaster)
			if err := c.Process(ctx, master); err != nil {
				return fmt.Errorf("sentinel %d: %w", i, err)
			}
			if flags := master.Val()["flags"]; flags != "master" {
				return fmt.Errorf("sentinel %d sees the master as %q", i, flags)
			}
			replicas, err := c.Do(ctx, "SENTINEL", "REPLICAS", sentinelMaster).Slice()
			if err != nil {
				return fmt.Errorf("sentinel %d: %w", i, err)
			}
			if len(replicas) < 1 {
				return fmt.Errorf("sentinel %d knows no replica", i)
			}
			others, err := c.Do(ctx, "SENTINEL", "SENTINELS", sentinelMaster).Slice()
			if err != nil {
				return fmt.Errorf("sentinel %d: %w", i, err)
			}
			if len(others) != len(s.sentinels)-1 {
				return fmt.Errorf("sentinel %d knows %d other sentinels, want %d", i, len(others), len(s.sentinels)-1)
			}
		}
		return nil
	})
}

// WaitReplicated waits until the replica has every write the current
// master acknowledged, so that a failover loses nothing. WAIT counts only
// its own connection's writes, so it follows a write of its own: the
// replica applies the stream in order. (A master that has just synced a
// replica streams to it only after the replica's first ACK, up to a second
// later.)
func (s *Sentinel) WaitReplicated(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	conn := s.client(s.MasterAddr(t)).Conn()
	defer conn.Close()
	// Written and deleted, so that it leaves no key behind.
	if err := conn.Set(ctx, "testredis:replicated", 1, 0).Err(); err != nil {
		t.Fatalf("testredis: writing on the master: %v", err)
	}
	if err := conn.Del(ctx, "testredis:replicated").Err(); err != nil {
		t.Fatalf("testredis: writing on the master: %v", err)
	}
	n, err := conn.Wait(ctx, 1, 5*time.Second).Result()
	if err != nil || n < 1 {
		t.Fatalf("testredis: WAIT 1 on the master = %d, %v", n, err)
	}
}

// KillMaster sends SIGKILL to the data node that is the master now, and
// returns its address.
func (s *Sentinel) KillMaster(t testing.TB) string {
	t.Helper()
	addr := s.MasterAddr(t)
	for _, p := range s.data {
		if p.addr() == addr {
			p.kill()
			return addr
		}
	}
	t.Fatalf("testredis: the master %s is not one of ours", addr)
	return ""
}

// WaitFailover waits, at most timeout, until every live Sentinel names a
// master other than old and that node says it is a master, and returns
// the new master's address.
func (s *Sentinel) WaitFailover(t testing.TB, old string, timeout time.Duration) string {
	t.Helper()
	var addr string
	gaveUp := true // until waitUntil returns: its t.Fatalf skips the rest
	defer func() {
		if gaveUp {
			for i, sp := range s.sentinels {
				t.Logf("testredis: sentinel %d's log:\n%s", i, sp.lastLog(40))
			}
		}
	}()
	waitUntil(t, "the failover", timeout, func() error {
		addr = ""
		for i, sp := range s.sentinels {
			if !sp.alive() {
				continue
			}
			a, err := s.masterFrom(sp)
			if err != nil {
				return fmt.Errorf("sentinel %d: %w", i, err)
			}
			if a == old {
				return fmt.Errorf("sentinel %d still names %s", i, old)
			}
			if addr != "" && a != addr {
				return fmt.Errorf("sentinels disagree: %s and %s", addr, a)
			}
			addr = a
		}
		role, err := s.client(addr).Do(context.Background(), "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s is not a master yet: %v", addr, role)
		}
		return nil
	})
	gaveUp = false
	return addr
}

// Pause stops the data node at addr with SIGSTOP: it keeps its
// connections but answers nothing, like a stalled replica. Resume undoes
// it; the test's end does too.
func (s *Sentinel) Pause(t testing.TB, addr string) {
	t.Helper()
	s.signal(t, addr, syscall.SIGSTOP)
	t.Cleanup(func() { _ = s.dataNode(addr).signal(syscall.SIGCONT) })
}

// Resume continues a paused data node with SIGCONT.
func (s *Sentinel) Resume(t testing.TB, addr string) {
	t.Helper()
	s.signal(t, addr, syscall.SIGCONT)
}

func (s *Sentinel) signal(t testing.TB, addr string, sig syscall.Signal) {
	t.Helper()
	p := s.dataNode(addr)
	if p == nil {
		t.Fatalf("testredis: %s is not one of the data nodes", addr)
	}
	if err := p.signal(sig); err != nil {
		t.Fatalf("testredis: signalling %s: %v", addr, err)
	}
}

func (s *Sentinel) dataNode(addr string) *proc {
	for _, p := range s.data {
		if p != nil && p.addr() == addr {
			return p
		}
	}
	return nil
}

func (s *Sentinel) close() {
	s.clients.Range(func(_, v any) bool {
		v.(*goredis.Client).Close()
		return true
	})
	for _, p := range s.sentinels {
		p.kill()
	}
	for _, p := range s.data {
		if p != nil {
			p.kill()
		}
	}
}

// FailoverWait is how long tests wait for a Sentinel failover: a first
// election that fails (a split vote, or a Sentinel slowed down on a loaded
// machine) is retried after twice the failover timeout, 20s.
const FailoverWait = 30 * time.Second
