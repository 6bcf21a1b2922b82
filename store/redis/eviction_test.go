package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// provisionObserved provisions s with its logs kept for the test to read.
func provisionObserved(t *testing.T, s *Store) (*Store, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	s.logger = zap.New(core)
	return storetest.Provision(t, s), logs
}

// policyLogs waits until n lines name maxmemory-policy, and returns them.
func policyLogs(t *testing.T, logs *observer.ObservedLogs, n int) []observer.LoggedEntry {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := logs.FilterMessageSnippet("maxmemory-policy").AllUntimed()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines named maxmemory-policy within 10s, want %d; the logs: %v", len(got), n, logs.AllUntimed())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantPolicyLine fails unless e is at level and its message says each of words.
func wantPolicyLine(t *testing.T, e observer.LoggedEntry, level zapcore.Level, words ...string) {
	t.Helper()
	if e.Level != level {
		t.Errorf("%v %q %v, want it at %v", e.Level, e.Message, e.ContextMap(), level)
	}
	for _, w := range words {
		if !strings.Contains(e.Message, w) {
			t.Errorf("%q does not say %q", e.Message, w)
		}
	}
}

// A Redis that may evict keys can drop a live claim, and a duplicate runs:
// the store says so at the level the policy deserves, and a server that
// refuses CONFIG (a managed Redis) gets the rule at info.
func TestEvictionPolicyIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		level  zapcore.Level
		policy string // the maxmemory-policy field, "" for none
		words  []string
	}{
		{"allkeys-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, zap.WarnLevel, "allkeys-lru",
			[]string{"maxmemory-policy", "evict", "retry runs again", "noeviction"}},
		// Every claim has a TTL: volatile-* evicts it as readily.
		{"volatile-lru", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"}, zap.WarnLevel, "volatile-lru",
			[]string{"maxmemory-policy", "retry runs again"}},
		{"noeviction", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, zap.DebugLevel, "noeviction", nil},
		// Without maxmemory nothing is evicted, whatever the policy.
		{"no maxmemory", []string{"--maxmemory-policy", "allkeys-lru"}, zap.DebugLevel, "allkeys-lru", nil},
		{"CONFIG renamed", []string{"--rename-command", "CONFIG", ""}, zap.InfoLevel, "",
			[]string{"could not read", "maxmemory-policy", "noeviction"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testredis.StartWith(t, tc.args...)
			_, logs := provisionObserved(t, &Store{Addresses: []string{srv.Addr()}})
			got := policyLogs(t, logs, 1)
			wantPolicyLine(t, got[0], tc.level, tc.words...)
			if p, _ := got[0].ContextMap()["maxmemory-policy"].(string); p != tc.policy {
				t.Errorf("maxmemory-policy field %q, want %q", p, tc.policy)
			}
			if n := logs.FilterLevelExact(zap.WarnLevel).Len(); tc.level != zap.WarnLevel && n != 0 {
				t.Errorf("%d warnings: %v", n, logs.AllUntimed())
			}
		})
	}
}

// An ACL user without CONFIG, as managed services give, gets the rule.
func TestEvictionPolicyRefused(t *testing.T) {
	srv := testredis.StartWith(t, "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	_, logs := provisionObserved(t, &Store{Addresses: []string{srv.Addr()}, Username: "app", Password: "pw"})
	got := policyLogs(t, logs, 1)
	wantPolicyLine(t, got[0], zap.InfoLevel, "could not read", "noeviction")
	if err, _ := got[0].ContextMap()["error"].(string); !strings.Contains(err, "NOPERM") {
		t.Errorf("error field %q, want the NOPERM refusal", err)
	}
}

// Redis down at provisioning: Caddy starts at once, and the policy is read
// when the server answers.
func TestEvictionPolicyReadOnceRedisAnswers(t *testing.T) {
	srv := testredis.StartWith(t, "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
	srv.Kill()
	start := time.Now()
	_, logs := provisionObserved(t, failFast(&Store{Addresses: []string{srv.Addr()}}))
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Provision with Redis down took %v", took)
	}
	if n := logs.FilterMessageSnippet("maxmemory-policy").Len(); n != 0 {
		t.Fatalf("%d lines about the policy of a server that is down", n)
	}
	srv.Restart(t)
	wantPolicyLine(t, policyLogs(t, logs, 1)[0], zap.WarnLevel, "maxmemory-policy")
}

// Sentinel: the master's policy is read.
func TestEvictionPolicySentinel(t *testing.T) {
	sg := testredis.StartSentinel(t)
	master := sg.Client(sg.InitialMasterAddr())
	ctx := context.Background()
	if err := master.ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := master.ConfigSet(ctx, "maxmemory-policy", "allkeys-lfu").Err(); err != nil {
		t.Fatal(err)
	}
	_, logs := provisionObserved(t, &Store{Addresses: sg.SentinelAddrs(), MasterName: sg.MasterName()})
	got := policyLogs(t, logs, 1)
	wantPolicyLine(t, got[0], zap.WarnLevel, "maxmemory-policy")
	if p, _ := got[0].ContextMap()["maxmemory-policy"].(string); p != "allkeys-lfu" {
		t.Errorf("maxmemory-policy field %q, want allkeys-lfu", p)
	}
}

// Cluster: every master's policy is read, and the one that evicts is named.
func testClusterEvictionPolicy(t *testing.T, cl *testredis.Cluster) {
	ctx := context.Background()
	node := cl.Node(1)
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := node.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = node.ConfigSet(ctx, "maxmemory", "0").Err()
		_ = node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()
	})
	// pool_size: a client of its own, whose check this test sees.
	_, logs := provisionObserved(t, &Store{Addresses: cl.Addrs(), KeyPrefix: "eviction", PoolSize: 7})
	got := policyLogs(t, logs, 3)
	if len(got) != 3 {
		t.Fatalf("%d lines about the policy of 3 masters: %v", len(got), got)
	}
	warned := logs.FilterLevelExact(zap.WarnLevel).AllUntimed()
	if len(warned) != 1 {
		t.Fatalf("%d warnings, want 1, for node 1: %v", len(warned), got)
	}
	if m, _ := warned[0].ContextMap()["master"].(string); m != cl.Addrs()[1] {
		t.Errorf("the warning names master %q, want node 1 at %s", m, cl.Addrs()[1])
	}
}
