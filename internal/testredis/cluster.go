package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/faultproxy"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testproc"
)

// ClusterOptions describes a Cluster for StartClusterWith.
type ClusterOptions struct {
	// Masters is the number of masters, which share the 16384 slots
	// evenly. At least 3 (redis-cli refuses fewer).
	Masters int
	// Replicas gives every master one replica: node Masters+i replicates
	// node i.
	Replicas bool
	// Proxied puts a faultproxy in front of every node and makes the node
	// announce the proxy's port as its own (cluster-announce-port), so that
	// clients, which learn node addresses from CLUSTER SLOTS and MOVED
	// redirects, reach every node through its proxy. The cluster bus
	// between nodes stays direct.
	Proxied bool
	// Args are more redis-server arguments for every node, such as
	// "--rename-command", "SPUBLISH", "" to take a command away.
	Args []string
}

// Cluster is a Redis Cluster of local redis-server processes owned by a
// test. Nodes are numbered from 0: the masters first, then the replicas.
type Cluster struct {
	opts    ClusterOptions
	nodes   []*clusterNode
	clients sync.Map // index -> *goredis.Client
}

type clusterNode struct {
	*proc
	busPort int
	proxy   *faultproxy.Proxy // with Proxied
	id      string
	joined  bool // part of the cluster
}

// announced is the address clients know the node by.
func (n *clusterNode) announced() string {
	if n.proxy != nil {
		return n.proxy.Addr()
	}
	return n.addr()
}

// StartCluster starts a cluster of masters without replicas, and returns
// once every node reports cluster_state:ok and knows every other node. A
// missing redis-server or redis-cli fails the test.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Masters: masters})
}

// StartClusterWith starts the cluster that opts describes.
func StartClusterWith(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.Masters < 3 {
		t.Fatalf("testredis: a cluster needs at least 3 masters, not %d", opts.Masters)
	}
	server, cli := lookBin(t, "redis-server"), lookBin(t, "redis-cli")
	c := &Cluster{opts: opts}
	t.Cleanup(c.close)

	total := opts.Masters
	if opts.Replicas {
		total *= 2
	}
	for i := range total {
		n, err := c.startNode(t, server)
		if err != nil {
			t.Fatalf("testredis: starting cluster node %d: %v", i, err)
		}
		c.nodes = append(c.nodes, n)
	}

	args := []string{"--cluster", "create"}
	for _, n := range c.nodes[:opts.Masters] {
		args = append(args, n.announced())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("testredis: redis-cli --cluster create: %v\n%s", err, out)
	}
	for i, n := range c.nodes {
		id, err := c.Node(i).ClusterMyID(context.Background()).Result()
		if err != nil {
			t.Fatalf("testredis: CLUSTER MYID on node %d: %v", i, err)
		}
		n.id = id
		n.joined = i < opts.Masters
	}
	c.WaitOK(t)

	if opts.Replicas {
		for i := range opts.Masters {
			c.addReplica(t, opts.Masters+i, i)
		}
		c.WaitOK(t)
	}
	return c
}

func (c *Cluster) startNode(t testing.TB, bin string) (*clusterNode, error) {
	var n *clusterNode
	_, err := testproc.OnFreePort(func(port int) error {
		bus, err := testproc.FreePort()
		if err != nil {
			return err
		}
		dir, err := os.MkdirTemp(t.TempDir(), "node")
		if err != nil {
			return err
		}
		n = &clusterNode{busPort: bus}
		args := serverArgs(dir, port,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			// The bus port is explicit: port+10000 may not exist.
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "2000",
			// Replicas sync at once instead of waiting 5s for more of them.
			"--repl-diskless-sync-delay", "0",
		)
		args = append(args, c.opts.Args...)
		if c.opts.Proxied {
			n.proxy = faultproxy.Start(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			_, pport, _ := net.SplitHostPort(n.proxy.Addr())
			args = append(args,
				"--cluster-announce-ip", "127.0.0.1",
				"--cluster-announce-port", pport,
				"--cluster-announce-bus-port", strconv.Itoa(bus))
		}
		if n.proc, err = startProc(bin, dir, port, args...); err != nil && n.proxy != nil {
			n.proxy.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// addReplica joins node r to the cluster as the replica of master m and
// waits until it is in sync.
func (c *Cluster) addReplica(t testing.TB, r, m int) {
	t.Helper()
	ctx := context.Background()
	master := c.nodes[m]
	host, port, _ := net.SplitHostPort(master.announced())
	if err := c.Node(r).Do(ctx, "CLUSTER", "MEET", host, port, strconv.Itoa(master.busPort)).Err(); err != nil {
		t.Fatalf("testredis: CLUSTER MEET from node %d: %v", r, err)
	}
	c.waitUntil(t, fmt.Sprintf("node %d to learn of master %d", r, m), func() error {
		nodes, err := c.Node(r).ClusterNodes(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(nodes, master.id) {
			return fmt.Errorf("CLUSTER NODES has no %s", master.id)
		}
		return nil
	})
	c.waitUntil(t, fmt.Sprintf("node %d to accept master %d", r, m), func() error {
		// REPLICATE fails until the node knows the master as a master.
		return c.Node(r).Do(ctx, "CLUSTER", "REPLICATE", master.id).Err()
	})
	c.waitUntil(t, fmt.Sprintf("node %d to replicate master %d", r, m), func() error {
		info, err := c.Node(r).Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replication link not up")
		}
		return nil
	})
	c.nodes[r].joined = true
}

// WaitOK waits until every live node reports cluster_state:ok, knows every
// other live node as connected, and agrees on which node serves each slot.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	c.waitUntil(t, "the cluster to be ok on every node", func() error {
		var first string
		for i, n := range c.nodes {
			if !n.alive() || !n.joined {
				continue
			}
			info, err := c.Node(i).ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("node %d: %w", i, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("node %d: cluster state not ok", i)
			}
			nodes, err := c.Node(i).ClusterNodes(ctx).Result()
			if err != nil {
				return fmt.Errorf("node %d: %w", i, err)
			}
			for j, other := range c.nodes {
				if other.alive() && other.joined && !knowsConnected(nodes, other.id) {
					return fmt.Errorf("node %d does not see node %d connected", i, j)
				}
			}
			view := slotView(nodes)
			if first == "" {
				first = view
			} else if view != first {
				return fmt.Errorf("node %d disagrees on the slot map", i)
			}
		}
		return nil
	})
}

// knowsConnected reports whether CLUSTER NODES output lists id as connected
// and not failing.
func knowsConnected(nodes, id string) bool {
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) >= 8 && f[0] == id {
			return f[7] == "connected" && !strings.Contains(f[2], "fail")
		}
	}
	return false
}

// slotView is the part of CLUSTER NODES that must agree across nodes: who
// is a master of which slots (migration markers aside).
func slotView(nodes string) string {
	var lines []string
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "master") {
			continue
		}
		var slots []string
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") {
				slots = append(slots, s)
			}
		}
		lines = append(lines, f[0]+" "+strings.Join(slots, ","))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// waitUntil gives every step of the cluster's life the same 30s.
func (c *Cluster) waitUntil(t testing.TB, what string, cond func() error) {
	t.Helper()
	waitUntil(t, what, 30*time.Second, cond)
}

// Addrs are the addresses clients should use, one per node (the proxies'
// with Proxied): give them all to a cluster client as seeds.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.announced()
	}
	return addrs
}

// NodeAddr is node i's own address, never proxied.
func (c *Cluster) NodeAddr(i int) string { return c.nodes[i].addr() }

// Len is the number of nodes, masters and replicas.
func (c *Cluster) Len() int { return len(c.nodes) }

// Proxy is the faultproxy in front of node i (nil without Proxied).
func (c *Cluster) Proxy(i int) *faultproxy.Proxy { return c.nodes[i].proxy }

// Proxies are the faultproxies of every node (empty without Proxied).
func (c *Cluster) Proxies() []*faultproxy.Proxy {
	var ps []*faultproxy.Proxy
	for _, n := range c.nodes {
		if n.proxy != nil {
			ps = append(ps, n.proxy)
		}
	}
	return ps
}

// ID is node i's cluster node ID.
func (c *Cluster) ID(i int) string { return c.nodes[i].id }

// Node is a plain client of node i alone (direct, never proxied), for
// administration and inspection. It is closed when the test ends.
func (c *Cluster) Node(i int) *goredis.Client {
	if cl, ok := c.clients.Load(i); ok {
		return cl.(*goredis.Client)
	}
	cl := goredis.NewClient(&goredis.Options{Addr: c.nodes[i].addr(), DisableIdentity: true, MaxRetries: -1})
	if prev, loaded := c.clients.LoadOrStore(i, cl); loaded {
		cl.Close()
		return prev.(*goredis.Client)
	}
	return cl
}

// Kill sends SIGKILL to node i, like a crash.
func (c *Cluster) Kill(i int) { c.nodes[i].kill() }

// IsMaster reports whether node i says it is a master.
func (c *Cluster) IsMaster(t testing.TB, i int) bool {
	t.Helper()
	role, err := c.Node(i).Do(context.Background(), "ROLE").Slice()
	if err != nil {
		t.Fatalf("testredis: ROLE on node %d: %v", i, err)
	}
	return len(role) > 0 && role[0] == "master"
}

// SlotOwner is the index of the node that node 0 (or the first live node)
// says serves slot.
func (c *Cluster) SlotOwner(t testing.TB, slot int) int {
	t.Helper()
	for i, n := range c.nodes {
		if !n.alive() {
			continue
		}
		slots, err := c.Node(i).ClusterSlots(context.Background()).Result()
		if err != nil {
			t.Fatalf("testredis: CLUSTER SLOTS on node %d: %v", i, err)
		}
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
				return c.indexOf(t, s.Nodes[0].Addr)
			}
		}
		t.Fatalf("testredis: no node serves slot %d", slot)
	}
	t.Fatal("testredis: no live node")
	return -1
}

func (c *Cluster) indexOf(t testing.TB, announced string) int {
	t.Helper()
	for i, n := range c.nodes {
		if n.announced() == announced {
			return i
		}
	}
	t.Fatalf("testredis: no node announces %s", announced)
	return -1
}

// BeginMigration marks slot as migrating from node from to node to
// (CLUSTER SETSLOT IMPORTING on to, then MIGRATING on from). Until
// MoveSlotKeys and FinishMigration, keys of the slot that are still on
// from are served there, and the others get ASK redirects to to.
func (c *Cluster) BeginMigration(t testing.TB, slot, from, to int) {
	t.Helper()
	ctx := context.Background()
	s := strconv.Itoa(slot)
	if err := c.Node(to).Do(ctx, "CLUSTER", "SETSLOT", s, "IMPORTING", c.nodes[from].id).Err(); err != nil {
		t.Fatalf("testredis: SETSLOT %d IMPORTING on node %d: %v", slot, to, err)
	}
	if err := c.Node(from).Do(ctx, "CLUSTER", "SETSLOT", s, "MIGRATING", c.nodes[to].id).Err(); err != nil {
		t.Fatalf("testredis: SETSLOT %d MIGRATING on node %d: %v", slot, from, err)
	}
}

// MoveKeys moves the given keys, which must be in a migrating slot, from
// node from to node to with MIGRATE, as redis-cli --cluster reshard does.
func (c *Cluster) MoveKeys(t testing.TB, from, to int, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		return
	}
	host, port, _ := net.SplitHostPort(c.nodes[to].addr())
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := c.Node(from).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("testredis: MIGRATE %v from node %d to %d: %v", keys, from, to, err)
	}
}

// SlotKeys lists the keys of slot stored on node i.
func (c *Cluster) SlotKeys(t testing.TB, i, slot int) []string {
	t.Helper()
	keys, err := c.Node(i).ClusterGetKeysInSlot(context.Background(), slot, 1000).Result()
	if err != nil {
		t.Fatalf("testredis: CLUSTER GETKEYSINSLOT %d on node %d: %v", slot, i, err)
	}
	return keys
}

// FinishMigration assigns slot to node to on every master (CLUSTER SETSLOT
// NODE, destination first, as Redis documents) and waits until the cluster
// agrees.
func (c *Cluster) FinishMigration(t testing.TB, slot, from, to int) {
	t.Helper()
	ctx := context.Background()
	order := []int{to, from}
	for i, n := range c.nodes {
		if i != to && i != from && n.alive() && c.IsMaster(t, i) {
			order = append(order, i)
		}
	}
	for _, i := range order {
		if err := c.Node(i).Do(ctx, "CLUSTER", "SETSLOT", strconv.Itoa(slot), "NODE", c.nodes[to].id).Err(); err != nil {
			t.Fatalf("testredis: SETSLOT %d NODE on node %d: %v", slot, i, err)
		}
	}
	c.WaitOK(t)
}

// Failover makes replica node r take over from its master with a manual
// CLUSTER FAILOVER, which waits for the replica to have every write its
// master acknowledged before switching: no write is lost. It returns once
// r is a master and the whole cluster agrees.
func (c *Cluster) Failover(t testing.TB, r int) {
	t.Helper()
	ctx := context.Background()
	// A manual failover that does not finish within Redis's own limit (5s:
	// the master must pause its clients, the replica catch up and win a
	// vote) is abandoned by Redis without a word, which happens on a loaded
	// machine; ask again then.
	var asked time.Time
	c.waitUntil(t, fmt.Sprintf("node %d to become a master", r), func() error {
		if c.IsMaster(t, r) {
			return nil
		}
		if time.Since(asked) > 6*time.Second {
			if err := c.Node(r).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
				t.Fatalf("testredis: CLUSTER FAILOVER on node %d: %v", r, err)
			}
			asked = time.Now()
		}
		return fmt.Errorf("node %d is still a replica", r)
	})
	c.WaitOK(t)
}

// KeySlot is the cluster hash slot of key: CRC16 (XMODEM) of its hash tag,
// the part between the first '{' and the next '}' when that is not empty,
// or of the whole key, modulo 16384.
func KeySlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func (c *Cluster) close() {
	c.clients.Range(func(_, v any) bool {
		v.(*goredis.Client).Close()
		return true
	})
	for _, n := range c.nodes {
		n.kill()
	}
}
