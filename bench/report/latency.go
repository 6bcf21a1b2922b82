package main

import (
	"fmt"
	"strings"
)

// latencyRoutes are the routes whose added latency over reverse_proxy the
// report shows: the stores, and the floors they are measured against.
var latencyRoutes = []string{"memory", "redis", "redis_unpipelined", "redis_cached", "postgres", "postgres_unpipelined", "file",
	"baseline_cas", "baseline_pg"}

// writeAddedLatency writes, per key mode, what each route adds to plain
// reverse_proxy's p50 and p99 latency: the median over rounds of the
// difference within a round, so that both sides saw the same machine.
func writeAddedLatency(md *strings.Builder, cells map[caseKey]map[string]*cell, modes []string, concs []int) {
	if !ran(cells, "proxy") {
		return
	}
	fmt.Fprintf(md, "## Added latency over reverse_proxy\n\n")
	fmt.Fprintf(md, "What each route adds to plain `reverse_proxy`'s p50 and p99, in µs: per round the route's latency\n")
	fmt.Fprintf(md, "minus `proxy`'s in the same round, then the median over rounds. Loopback, so these are the handler's\n")
	fmt.Fprintf(md, "and the store's own time, not a network's.\n\n")
	for _, mode := range modes {
		var routes []string
		for _, r := range latencyRoutes {
			if ran(cells, r) {
				routes = append(routes, r)
			}
		}
		if len(routes) == 0 {
			return
		}
		fmt.Fprintf(md, "**%s** (p50 / p99 added, µs)\n\n| conc |", mode)
		for _, r := range routes {
			fmt.Fprintf(md, " %s |", r)
		}
		fmt.Fprintf(md, "\n|---:|%s\n", strings.Repeat("---:|", len(routes)))
		for _, conc := range concs {
			byRoute := cells[caseKey{mode, conc}]
			proxy := byRoute["proxy"]
			if proxy == nil {
				continue
			}
			fmt.Fprintf(md, "| %d |", conc)
			for _, r := range routes {
				c := byRoute[r]
				if c == nil {
					fmt.Fprintf(md, " – |")
					continue
				}
				p50, p99 := addedLatency(c, proxy)
				fmt.Fprintf(md, " %+.0f / %+.0f |", p50, p99)
			}
			fmt.Fprintf(md, "\n")
		}
		fmt.Fprintf(md, "\n")
	}
}

func addedLatency(c, proxy *cell) (p50, p99 float64) {
	byRound := map[int]run{}
	for _, r := range proxy.runs {
		byRound[r.Round] = r
	}
	var d50, d99 []float64
	for _, r := range c.runs {
		if b, ok := byRound[r.Round]; ok {
			d50 = append(d50, r.P50us-b.P50us)
			d99 = append(d99, r.P99us-b.P99us)
		}
	}
	return median(d50), median(d99)
}
