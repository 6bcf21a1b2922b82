package main

import (
	"fmt"
	"math"
	"strings"
)

// target is a limit on one route's per-round ratio against a reference
// route, in one key mode.
type target struct {
	name       string
	mode       string
	route      string
	ref        string
	metric     metric
	limit      float64
	atMost     bool // the measured ratio must be <= limit (else >= limit)
	strictMore bool // > instead of >=
}

func writeTargets(md *strings.Builder, cells map[caseKey]map[string]*cell, concs []int) {
	issue5 := []target{
		{"redis new key: CPU/req ≤ 1.05 × baseline", "new", "redis", "baseline", cpuPerReq, 1.05, true, false},
		{"redis new key: throughput ≥ 0.95 × baseline", "new", "redis", "baseline", throughput, 0.95, false, false},
		{"redis new key: p99 ≤ 1.10 × baseline", "new", "redis", "baseline", p99Latency, 1.10, true, false},
		{"redis replay: CPU/req ≤ 1.05 × baseline", "replay", "redis", "baseline", cpuPerReq, 1.05, true, false},
		{"redis replay: throughput ≥ 0.95 × baseline", "replay", "redis", "baseline", throughput, 0.95, false, false},
		{"redis replay: p99 ≤ 1.10 × baseline", "replay", "redis", "baseline", p99Latency, 1.10, true, false},
		{"redis new key: throughput ≥ 1.0 × proxy", "new", "redis", "proxy", throughput, 1.0, false, false},
		{"redis replay: throughput ≥ 2 × proxy", "replay", "redis", "proxy", throughput, 2.0, false, false},
		{"memory new key: throughput ≥ 0.95 × proxy", "new", "memory", "proxy", throughput, 0.95, false, false},
		{"memory replay: throughput > 1 × proxy", "replay", "memory", "proxy", throughput, 1.0, false, true},
	}
	// The same redis limits against the owner-checked floor, when it ran.
	if ran(cells, "baseline_cas") {
		issue5 = append(issue5,
			target{"redis new key: CPU/req ≤ 1.05 × baseline_cas", "new", "redis", "baseline_cas", cpuPerReq, 1.05, true, false},
			target{"redis new key: throughput ≥ 0.95 × baseline_cas", "new", "redis", "baseline_cas", throughput, 0.95, false, false},
			target{"redis new key: p99 ≤ 1.10 × baseline_cas", "new", "redis", "baseline_cas", p99Latency, 1.10, true, false},
			target{"redis replay: CPU/req ≤ 1.05 × baseline_cas", "replay", "redis", "baseline_cas", cpuPerReq, 1.05, true, false},
			target{"redis replay: throughput ≥ 0.95 × baseline_cas", "replay", "redis", "baseline_cas", throughput, 0.95, false, false},
			target{"redis replay: p99 ≤ 1.10 × baseline_cas", "replay", "redis", "baseline_cas", p99Latency, 1.10, true, false},
		)
	}
	fmt.Fprintf(md, "## Issue 5 targets\n\n")
	fmt.Fprintf(md, "Each target against the median per-round ratio at each concurrency; ✅ met, ❌ missed (by how much, in\n")
	fmt.Fprintf(md, "percent of the limit). Throughput ratios on this shared 2-core machine swing by several percent from run to run.\n")
	fmt.Fprintf(md, "In brackets, for CPU targets in runs of four rounds or more: the middle half of the per-round ratios (25th to\n")
	fmt.Fprintf(md, "75th percentile), how far a single round strays; a median inside a bracket that spans the limit is not a verdict.\n")
	fmt.Fprintf(md, "The issue's limits are against `baseline` (plain `SET` completion, no owner check); the rows marked\n")
	fmt.Fprintf(md, "× baseline_cas, when that route ran, apply the same limits against the owner-checked floor.\n\n")
	writeTargetTable(md, issue5, cells, concs)

	// Each row only when both its routes ran: redis_cached needs a build
	// whose redis store has local_cache, baseline_pg a PostgreSQL.
	var issue12 []target
	for _, t := range []target{
		{"postgres new key: CPU/req ≤ 1.15 × baseline_pg", "new", "postgres", "baseline_pg", cpuPerReq, 1.15, true, false},
		{"postgres new key: throughput ≥ 0.9 × baseline_pg", "new", "postgres", "baseline_pg", throughput, 0.9, false, false},
		{"postgres replay: CPU/req ≤ 1.15 × baseline_pg", "replay", "postgres", "baseline_pg", cpuPerReq, 1.15, true, false},
		{"postgres replay: throughput ≥ 0.9 × baseline_pg", "replay", "postgres", "baseline_pg", throughput, 0.9, false, false},
		{"redis_cached replay: throughput ≥ 0.95 × memory", "replay", "redis_cached", "memory", throughput, 0.95, false, false},
		{"redis_cached replay: CPU/req ≤ 1.05 × memory", "replay", "redis_cached", "memory", cpuPerReq, 1.05, true, false},
		{"redis_cached new key: CPU/req ≤ 1.02 × redis", "new", "redis_cached", "redis", cpuPerReq, 1.02, true, false},
	} {
		if ran(cells, t.route) && ran(cells, t.ref) {
			issue12 = append(issue12, t)
		}
	}
	if len(issue12) > 0 {
		fmt.Fprintf(md, "## Issue 12 targets\n\n")
		fmt.Fprintf(md, "Read as above. The postgres store against `baseline_pg`, its floor (one `INSERT ... ON CONFLICT`\n")
		fmt.Fprintf(md, "claim-or-read, one owner-checked `UPDATE`); the redis store with its local replay cache (`redis_cached`)\n")
		fmt.Fprintf(md, "against the memory store for replays and against the plain redis store for new keys.\n\n")
		writeTargetTable(md, issue12, cells, concs)
	}

	var issue37 []target
	for _, t := range []target{
		{"postgres new key: throughput ≥ 2 × baseline_pg (c=64)", "new", "postgres", "baseline_pg", throughput, 2.0, false, false},
		{"postgres new key: CPU/req ≤ 0.8 × baseline_pg (c=64)", "new", "postgres", "baseline_pg", cpuPerReq, 0.8, true, false},
		{"postgres replay: CPU/req ≤ 1.0 × baseline_pg (c=16, 64)", "replay", "postgres", "baseline_pg", cpuPerReq, 1.0, true, false},
		{"postgres new key: p50 ≤ 1.10 × postgres_unpipelined (c=1)", "new", "postgres", "postgres_unpipelined", p50Latency, 1.10, true, false},
		{"postgres new key: p99 ≤ 1.10 × postgres_unpipelined (c=1)", "new", "postgres", "postgres_unpipelined", p99Latency, 1.10, true, false},
		{"postgres replay: p50 ≤ 1.10 × postgres_unpipelined (c=1)", "replay", "postgres", "postgres_unpipelined", p50Latency, 1.10, true, false},
		{"postgres replay: p99 ≤ 1.10 × postgres_unpipelined (c=1)", "replay", "postgres", "postgres_unpipelined", p99Latency, 1.10, true, false},
	} {
		if ran(cells, t.route) && ran(cells, t.ref) {
			issue37 = append(issue37, t)
		}
	}
	if len(issue37) > 0 {
		fmt.Fprintf(md, "## Issue 37 targets\n\n")
		fmt.Fprintf(md, "Read as above; each target applies at the concurrency in brackets, the other columns are for reference.\n")
		fmt.Fprintf(md, "The issue sets them with fsync and synchronous_commit on (`PG_FSYNC=1`, see Machine). The latency rows\n")
		fmt.Fprintf(md, "compare the store with pipelining, the default, against the same store with `pipelining off`, which sends\n")
		fmt.Fprintf(md, "each statement on its own as the store did before batching.\n\n")
		writeTargetTable(md, issue37, cells, concs)
	}

	var issue19 []target
	for _, t := range []target{
		{"redis new key: CPU/req ≤ 0.90 × baseline_cas", "new", "redis", "baseline_cas", cpuPerReq, 0.90, true, false},
		{"redis new key: Redis's CPU/req ≤ 0.60 × baseline_cas's", "new", "redis", "baseline_cas", storeCPU, 0.60, true, false},
		{"redis replay: CPU/req ≤ 1.05 × baseline_cas", "replay", "redis", "baseline_cas", cpuPerReq, 1.05, true, false},
		{"memory new key: CPU/req ≤ 1.10 × proxy", "new", "memory", "proxy", cpuPerReq, 1.10, true, false},
	} {
		if ran(cells, t.route) && ran(cells, t.ref) {
			issue19 = append(issue19, t)
		}
	}
	if len(issue19) == 0 {
		return
	}
	fmt.Fprintf(md, "## Issue 19 targets\n\n")
	fmt.Fprintf(md, "Read as above; the issue sets them at c=32. The redis store pipelines its calls (`pipelining`, on by\n")
	fmt.Fprintf(md, "default); `baseline_cas` sends each command on its own. Redis's CPU is the redis-server process's alone.\n\n")
	writeTargetTable(md, issue19, cells, concs)
}

// ran tells whether route ran in any case.
func ran(cells map[caseKey]map[string]*cell, route string) bool {
	for _, byRoute := range cells {
		if byRoute[route] != nil {
			return true
		}
	}
	return false
}

func writeTargetTable(md *strings.Builder, targets []target, cells map[caseKey]map[string]*cell, concs []int) {
	fmt.Fprintf(md, "| target |")
	for _, c := range concs {
		fmt.Fprintf(md, " c=%d |", c)
	}
	fmt.Fprintf(md, "\n|---|")
	for range concs {
		fmt.Fprintf(md, "---:|")
	}
	fmt.Fprintf(md, "\n")
	for _, t := range targets {
		fmt.Fprintf(md, "| %s |", t.name)
		for _, conc := range concs {
			c := cells[caseKey{t.mode, conc}][t.route]
			if c == nil {
				fmt.Fprintf(md, " n/a |")
				continue
			}
			v, ok := c.against(t.ref, t.metric)
			if !ok || math.IsNaN(v) {
				fmt.Fprintf(md, " n/a |")
				continue
			}
			var met bool
			switch {
			case t.atMost:
				met = v <= t.limit
			case t.strictMore:
				met = v > t.limit
			default:
				met = v >= t.limit
			}
			spread := ""
			if mid := c.vs[t.ref].cpuMid; t.metric == cpuPerReq && len(c.runs) >= 4 {
				spread = fmt.Sprintf(" [%.2f–%.2f]", mid[0], mid[1])
			}
			if met {
				fmt.Fprintf(md, " ✅ %.2f%s |", v, spread)
			} else {
				fmt.Fprintf(md, " ❌ %.2f (%+.0f%%)%s |", v, 100*(v-t.limit)/t.limit, spread)
			}
		}
		fmt.Fprintf(md, "\n")
	}
	fmt.Fprintf(md, "\n")
}
