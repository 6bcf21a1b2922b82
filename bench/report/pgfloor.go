package main

import (
	"fmt"
	"strings"
)

// writePGFloor compares the postgres route with baseline_pg, its floor, in
// a table of its own: the ×pg ratios mean nothing for the other routes, and
// the CPU of the servers (PostgreSQL's backends) next to Caddy's shows where
// the difference goes.
func writePGFloor(md *strings.Builder, cells map[caseKey]map[string]*cell, modes []string, concs []int) {
	if !ran(cells, "postgres") || !ran(cells, "baseline_pg") {
		return
	}
	fmt.Fprintf(md, "## PostgreSQL against its floor\n\n")
	fmt.Fprintf(md, "The postgres route against `baseline_pg` (`idem_baseline_pg`: one `INSERT ... ON CONFLICT DO NOTHING`\n")
	fmt.Fprintf(md, "claim-or-read of a random owner token, one `UPDATE ... WHERE key AND token` to store; a plain table with a\n")
	fmt.Fprintf(md, "primary key and nothing else), on the same private PostgreSQL in the same rounds. Medians as above; the ×pg\n")
	fmt.Fprintf(md, "ratios are medians of per-round ratios. CPU is Caddy plus the store servers (the PostgreSQL postmaster and\n")
	fmt.Fprintf(md, "every backend it forked, whose share is in parentheses). baseline_pg's ×cas ratios in the tables above\n")
	fmt.Fprintf(md, "compare the PostgreSQL floor with the Redis one.\n\n")
	fmt.Fprintf(md, "| mode | conc | req/s postgres | req/s baseline_pg | thr ×pg | CPU µs/req postgres (servers) | CPU µs/req baseline_pg (servers) | CPU ×pg | p99 µs postgres | p99 µs baseline_pg | p99 ×pg |\n")
	fmt.Fprintf(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mode := range modes {
		for _, conc := range concs {
			pg, floor := cells[caseKey{mode, conc}]["postgres"], cells[caseKey{mode, conc}]["baseline_pg"]
			if pg == nil || floor == nil {
				continue
			}
			fmt.Fprintf(md, "| %s | %d | %.0f | %.0f | %s | %.1f (%.1f) | %.1f (%.1f) | %s | %.0f | %.0f | %s |\n",
				mode, conc, pg.rps, floor.rps, pg.ratio("baseline_pg", throughput),
				pg.cpu, pg.cpuStore, floor.cpu, floor.cpuStore, pg.ratio("baseline_pg", cpuPerReq),
				pg.p99, floor.p99, pg.ratio("baseline_pg", p99Latency))
		}
	}
	fmt.Fprintf(md, "\n")
}
