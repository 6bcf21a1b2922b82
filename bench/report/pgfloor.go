package main

import (
	"fmt"
	"strings"
)

// writePGFloor compares the postgres routes with baseline_pg, their floor,
// in a table of their own: the ×pg ratios mean nothing for the other
// routes, and the CPU of the servers (PostgreSQL's backends) next to
// Caddy's shows where the difference goes. When postgres_unpipelined ran,
// a second table sets the store with pipelining against it without.
func writePGFloor(md *strings.Builder, cells map[caseKey]map[string]*cell, modes []string, concs []int) {
	if !ran(cells, "baseline_pg") || (!ran(cells, "postgres") && !ran(cells, "postgres_unpipelined")) {
		return
	}
	fmt.Fprintf(md, "## PostgreSQL against its floor\n\n")
	fmt.Fprintf(md, "The postgres routes against `baseline_pg` (`idem_baseline_pg`: one `INSERT ... ON CONFLICT DO NOTHING`\n")
	fmt.Fprintf(md, "claim-or-read of a random owner token, one `UPDATE ... WHERE key AND token` to store; a plain table with a\n")
	fmt.Fprintf(md, "primary key and nothing else), on the same private PostgreSQL in the same rounds. Medians as above; the ×pg\n")
	fmt.Fprintf(md, "ratios are medians of per-round ratios. CPU is Caddy plus the store servers (the PostgreSQL postmaster and\n")
	fmt.Fprintf(md, "every backend it forked, whose share is in parentheses). baseline_pg's ×cas ratios in the tables above\n")
	fmt.Fprintf(md, "compare the PostgreSQL floor with the Redis one. The Machine section says whether the server ran with\n")
	fmt.Fprintf(md, "fsync on (`PG_FSYNC=1`), where each commit waits for its WAL flush.\n\n")
	fmt.Fprintf(md, "| mode | conc | route | req/s | req/s baseline_pg | thr ×pg | CPU µs/req (servers) | CPU µs/req baseline_pg (servers) | CPU ×pg | p99 µs | p99 µs baseline_pg | p99 ×pg |\n")
	fmt.Fprintf(md, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mode := range modes {
		for _, conc := range concs {
			floor := cells[caseKey{mode, conc}]["baseline_pg"]
			for _, route := range []string{"postgres", "postgres_unpipelined"} {
				pg := cells[caseKey{mode, conc}][route]
				if pg == nil || floor == nil {
					continue
				}
				fmt.Fprintf(md, "| %s | %d | %s | %.0f | %.0f | %s | %.1f (%.1f) | %.1f (%.1f) | %s | %.0f | %.0f | %s |\n",
					mode, conc, route, pg.rps, floor.rps, pg.ratio("baseline_pg", throughput),
					pg.cpu, pg.cpuStore, floor.cpu, floor.cpuStore, pg.ratio("baseline_pg", cpuPerReq),
					pg.p99, floor.p99, pg.ratio("baseline_pg", p99Latency))
			}
		}
	}
	fmt.Fprintf(md, "\n")
	if !ran(cells, "postgres") || !ran(cells, "postgres_unpipelined") {
		return
	}
	fmt.Fprintf(md, "### PostgreSQL with pipelining against without\n\n")
	fmt.Fprintf(md, "The postgres route (its statements made while another is on the wire go together, one round trip and\n")
	fmt.Fprintf(md, "one commit) against `postgres_unpipelined` (`pipelining off`: every statement on its own), in the same\n")
	fmt.Fprintf(md, "rounds; ×unp are medians of per-round ratios.\n\n")
	fmt.Fprintf(md, "| mode | conc | req/s | req/s unpipelined | thr ×unp | CPU µs/req | CPU µs/req unpipelined | CPU ×unp | p50 µs | p50 µs unpipelined | p50 ×unp | p99 µs | p99 µs unpipelined | p99 ×unp |\n")
	fmt.Fprintf(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mode := range modes {
		for _, conc := range concs {
			pg, unp := cells[caseKey{mode, conc}]["postgres"], cells[caseKey{mode, conc}]["postgres_unpipelined"]
			if pg == nil || unp == nil {
				continue
			}
			fmt.Fprintf(md, "| %s | %d | %.0f | %.0f | %s | %.1f | %.1f | %s | %.0f | %.0f | %s | %.0f | %.0f | %s |\n",
				mode, conc, pg.rps, unp.rps, pg.ratio("postgres_unpipelined", throughput),
				pg.cpu, unp.cpu, pg.ratio("postgres_unpipelined", cpuPerReq),
				pg.p50, unp.p50, pg.ratio("postgres_unpipelined", p50Latency),
				pg.p99, unp.p99, pg.ratio("postgres_unpipelined", p99Latency))
		}
	}
	fmt.Fprintf(md, "\n")
}

// writeUpstreamRuns says whether every run made the upstream run exactly
// its new keys: none twice, and no replay.
func writeUpstreamRuns(md *strings.Builder, runs []run) {
	counted, off := 0, []string{}
	for _, r := range runs {
		if r.UpstreamRuns == nil || *r.UpstreamRuns < 0 {
			continue
		}
		counted++
		if *r.UpstreamRuns != r.NewKeys {
			off = append(off, fmt.Sprintf("| %s | %d | %d | %s | %d | %d |", r.Mode, r.Conc, r.Round+1, r.Route, r.NewKeys, *r.UpstreamRuns))
		}
	}
	if counted == 0 {
		return
	}
	fmt.Fprintf(md, "## Upstream runs\n\n")
	fmt.Fprintf(md, "The upstream counts the requests of each route it runs; every run, warm-up included, compares that count\n")
	fmt.Fprintf(md, "with the requests it sent with a fresh key and got an answer to: each new key runs once, and no replay\n")
	fmt.Fprintf(md, "runs.\n\n")
	if len(off) == 0 {
		fmt.Fprintf(md, "In all %d runs the upstream ran exactly the new keys.\n\n", counted)
		return
	}
	fmt.Fprintf(md, "In %d of %d runs the counts differ (a transport error leaves a key's run uncounted on the client side):\n\n", len(off), counted)
	fmt.Fprintf(md, "| mode | conc | round | route | new keys | upstream runs |\n|---|---:|---:|---|---:|---:|\n")
	fmt.Fprintf(md, "%s\n\n", strings.Join(off, "\n"))
}
