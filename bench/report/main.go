// Command report turns the JSON lines of loadgen into BENCHMARKS.md and a
// PNG chart (throughput and p99 against concurrency, one line per route).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type run struct {
	Mode       string             `json:"mode"`
	Conc       int                `json:"conc"`
	Route      string             `json:"route"`
	Round      int                `json:"round"`
	CPUus      map[string]float64 `json:"cpu_us_per_req"`
	CPUStoreUs float64            `json:"cpu_store_us_per_req"`
	CPUTotalUs float64            `json:"cpu_total_us_per_req"`
	OthersPct  float64            `json:"others_cpu_pct"`
	Requests   int                `json:"requests"`
	Errors     int                `json:"errors"`
	Unexpect   int                `json:"unexpected"`
	Statuses   map[string]int     `json:"statuses"`
	Replayed   int                `json:"replayed"`
	RPS        float64            `json:"rps"`
	P50us      float64            `json:"p50_us"`
	P99us      float64            `json:"p99_us"`
	SeedError  string             `json:"seed_error"`
	// The fresh keys sent over the whole load and the upstream's runs of
	// the route meanwhile (-1: not counted; absent in older results).
	NewKeys      int  `json:"new_keys"`
	UpstreamRuns *int `json:"upstream_runs"`
}

type wave struct {
	OK       int            `json:"ok"`
	Errors   int            `json:"errors"`
	FirstErr string         `json:"first_error"`
	Statuses map[string]int `json:"statuses"`
	Replayed int            `json:"replayed"`
	Bytes    int64          `json:"bytes"`
	Seconds  float64        `json:"seconds"`
	HWMkB    int64          `json:"vm_hwm_kb"`
	MaxRSSkB int64          `json:"max_rss_kb"`
	EndRSSkB int64          `json:"end_rss_kb"`
}

type memResult struct {
	Label     string `json:"label"`
	N         int    `json:"n"`
	IdleRSSkB int64  `json:"idle_rss_kb"`
	First     wave   `json:"first"`
	Replay    *wave  `json:"replay"`
}

type caseKey struct {
	mode string
	conc int
}

type cell struct {
	runs                                   []run
	rps, p50, p99, cpu, cpuCaddy, cpuStore float64
	others                                 float64
	rpsMin, rpsMax                         float64
	errors, unexpected, requests           int
	replayed                               int
	seedErr                                string
	// vs holds, for each reference route of the same case that ran, the
	// medians of the per-round ratios against it.
	vs map[string]ratios
}

type ratios struct {
	rps, cpu, p99, storeCPU, p50 float64
	// cpuMid is the middle half of the per-round CPU ratios (25th to
	// 75th percentile): how far one round's ratio strays on this machine.
	cpuMid [2]float64
}

// references are the routes others are compared with, round by round.
var references = []string{"proxy", "baseline", "baseline_cas", "baseline_pg", "memory", "redis", "postgres_unpipelined"}

// metric names one of the ratios.
type metric int

const (
	throughput metric = iota
	cpuPerReq
	p99Latency
	storeCPU // the store servers' own CPU per request
	p50Latency
)

func (r ratios) get(m metric) float64 {
	switch m {
	case throughput:
		return r.rps
	case cpuPerReq:
		return r.cpu
	case storeCPU:
		return r.storeCPU
	case p50Latency:
		return r.p50
	default:
		return r.p99
	}
}

// against is c's ratio of m against ref; false when ref did not run.
func (c *cell) against(ref string, m metric) (float64, bool) {
	r, ok := c.vs[ref]
	return r.get(m), ok
}

// ratio formats c's ratio of m against ref, "–" when ref did not run.
func (c *cell) ratio(ref string, m metric) string {
	v, ok := c.against(ref, m)
	if !ok {
		return "–"
	}
	return fmtRatio(v)
}

func main() {
	results := flag.String("results", "", "loadgen bench JSON lines")
	mem := flag.String("mem", "", "loadgen mem JSON lines (optional)")
	machine := flag.String("machine", "", "key=value lines describing the machine")
	settings := flag.String("settings", "", "one line describing the run settings")
	notes := flag.String("notes", "", "file with extra Markdown notes (optional)")
	profiles := flag.String("profiles", "", "semicolon-separated title=file of pprof -top outputs (optional)")
	out := flag.String("out", "BENCHMARKS.md", "Markdown output")
	png := flag.String("png", "benchmarks.png", "PNG chart output")
	runDir := flag.String("run-dir", "bench/out", "where the run's logs, raw results and profiles are, as shown in the report")
	flag.Parse()

	runs, err := readRuns(*results)
	if err != nil {
		log.Fatal(err)
	}
	if len(runs) == 0 {
		log.Fatal("no runs in ", *results)
	}
	var routes []string
	var modes []string
	var concs []int
	seenR, seenM, seenC := map[string]bool{}, map[string]bool{}, map[int]bool{}
	for _, r := range runs {
		if !seenR[r.Route] {
			seenR[r.Route] = true
			routes = append(routes, r.Route)
		}
		if !seenM[r.Mode] {
			seenM[r.Mode] = true
			modes = append(modes, r.Mode)
		}
		if !seenC[r.Conc] {
			seenC[r.Conc] = true
			concs = append(concs, r.Conc)
		}
	}
	routes = orderRoutes(routes)
	sort.Ints(concs)

	cells := map[caseKey]map[string]*cell{}
	for _, r := range runs {
		k := caseKey{r.Mode, r.Conc}
		if cells[k] == nil {
			cells[k] = map[string]*cell{}
		}
		c := cells[k][r.Route]
		if c == nil {
			c = &cell{}
			cells[k][r.Route] = c
		}
		c.runs = append(c.runs, r)
	}
	for _, byRoute := range cells {
		for _, c := range byRoute {
			summarize(c)
		}
		for route, c := range byRoute {
			c.vs = map[string]ratios{}
			for _, ref := range references {
				if b := byRoute[ref]; b != nil && route != ref {
					c.vs[ref] = pairedRatios(c, b)
				}
			}
		}
	}

	var md strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&md, format, a...) }
	w("# Benchmarks\n\n")
	w("Generated by `bench/run.sh`; do not edit by hand. Re-run the script to refresh it.\n\n")
	w("Side-by-side load on one Caddy process, one route per handler chain, all in front of the same tiny\n")
	w("upstream (a small JSON `201`), with the load generator, Caddy, Redis and the upstream on one machine:\n\n")
	w("| route | handler chain |\n|---|---|\n")
	desc := map[string]string{
		"proxy":    "`reverse_proxy` only",
		"baseline": "`idem_baseline` (bench/baseline: one `SET NX GET` to claim or read, one `SET` to store, nothing else) + `reverse_proxy`",
		"baseline_cas": "`idem_baseline { owner_check }` (bench/baseline: one `SET NX GET` of a random 16-byte owner token to claim or read, " +
			"then one minimal Lua script, `GETRANGE` of the token and `SET` only if it matches, to store; nothing else) + `reverse_proxy`",
		"memory":            "`idempotency` with `store memory` (defaults) + `reverse_proxy`",
		"redis":             "`idempotency` with `store redis` (calls pipelined while others are on the wire, the default) + `reverse_proxy`",
		"redis_unpipelined": "`idempotency` with `store redis { pipelining off }` (every call on its own) + `reverse_proxy`",
		"redis_cached":      "`idempotency` with `store redis { local_cache 64MiB }` (the redis store with a local replay cache) + `reverse_proxy`",
		"baseline_pg": "`idem_baseline_pg` (bench/baseline: one `INSERT ... ON CONFLICT DO NOTHING` of a random 16-byte owner token, " +
			"combined with the read of the existing row, to claim or read, then one `UPDATE ... WHERE key AND token` to store; " +
			"a plain table with a primary key, same server as postgres, nothing else) + `reverse_proxy`",
		"postgres": "`idempotency` with `store postgres` (private server; statements made while others are on the wire go as one batch, " +
			"the default) + `reverse_proxy`",
		"postgres_unpipelined": "`idempotency` with `store postgres { pipelining off }` (every statement on its own; same server, " +
			"table of its own) + `reverse_proxy`",
		"file": "`idempotency` with `store file` (bbolt, a synced transaction per write or group of concurrent writes) + `reverse_proxy`",
	}
	for _, r := range routes {
		w("| %s | %s |\n", r, cmpOr(desc[r], r))
	}
	w("\n")
	if *settings != "" {
		w("Settings: %s\n\n", *settings)
	}
	w("How to read it: every cell is the **median over rounds**; in each round every route runs once, in the\n")
	w("order of a row of a Williams design (over as many rounds as routes, twice that for an odd number, every\n")
	w("route runs once in each position and follows every other route equally often, so that what one run leaves\n")
	w("behind does not always fall on the same next route). Ratios (×base, ×cas, ×proxy) are the **median of the\n")
	w("per-round ratios** (each route against the baseline, baseline_cas or proxy run of the same round), so they\n")
	w("need not equal the quotient of the medians shown. Two floors: `baseline` completes with a plain `SET`, which\n")
	w("checks no ownership, so it is cheaper than any correct handler can be; `baseline_cas` completes with the\n")
	w("smallest owner-checked Lua script (`GETRANGE` of the claim's token, `SET` if it matches), the one step the\n")
	w("product cannot skip. The ×cas columns (thr ×cas, CPU ×cas, p99 ×cas) are the cost of the handler against\n")
	w("that true floor; ×base overstates it by the price of the script (see the baseline row's ×cas).\n")
	w("`baseline_pg`, when it ran, is the same floor for the postgres store: the postgres route against it is in a\n")
	w("table of its own below, and baseline_pg's ×cas ratios here compare the PostgreSQL floor with the Redis one.\n")
	w("CPU is utime+stime of Caddy plus the store servers (Redis, and PostgreSQL's postmaster with every\n")
	w("backend it forked, exited ones included through its cutime+cstime) read from `/proc/<pid>/stat` at the\n")
	w("edges of the measured window, divided by the requests completed in it. Latencies are client-side, in\n")
	w("microseconds. The machine is shared and has 2 cores for everything (load generator included), so absolute\n")
	w("figures are noisy and low; the ratios are the claim, and CPU per request is steadier than throughput. The\n")
	w("last column, others' CPU, is the median share of the machine's CPU used during the runs by processes that\n")
	w("are not part of the benchmark (from /proc/stat less the benchmark's processes): the noise from other work\n")
	w("on the host.\n\n")
	w("![throughput and p99 against concurrency](%s)\n\n", filepath.Base(*png))

	modeTitle := map[string]string{
		"new":    "New key every request (first execution: claim, upstream, store)",
		"replay": "Replay of a stored key (one store read, no upstream; how many keys the replays spread over: Settings)",
		"mix":    "50/50 mix of new keys and replays",
	}
	for _, mode := range modes {
		w("## %s\n\n", cmpOr(modeTitle[mode], mode))
		w("| conc | route | req/s | (min–max) | p50 µs | p99 µs | CPU µs/req | thr ×base | CPU ×base | p99 ×base | thr ×cas | CPU ×cas | p99 ×cas | thr ×proxy | replayed | errors | others' CPU |\n")
		w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, conc := range concs {
			byRoute := cells[caseKey{mode, conc}]
			for _, route := range routes {
				c := byRoute[route]
				if c == nil {
					continue
				}
				base, cpuB, p99B := c.ratio("baseline", throughput), c.ratio("baseline", cpuPerReq), c.ratio("baseline", p99Latency)
				thrC, cpuC, p99C := c.ratio("baseline_cas", throughput), c.ratio("baseline_cas", cpuPerReq), c.ratio("baseline_cas", p99Latency)
				prox := c.ratio("proxy", throughput)
				errs := strconv.Itoa(c.errors + c.unexpected)
				if c.seedErr != "" {
					errs += " (seed failed)"
				}
				w("| %d | %s | %.0f | %.0f–%.0f | %.0f | %.0f | %.1f | %s | %s | %s | %s | %s | %s | %s | %.0f%% | %s | %.0f%% |\n",
					conc, route, c.rps, c.rpsMin, c.rpsMax, c.p50, c.p99, c.cpu, base, cpuB, p99B, thrC, cpuC, p99C, prox,
					100*float64(c.replayed)/math.Max(1, float64(c.requests)), errs, c.others)
			}
		}
		w("\n")
	}

	writePGFloor(&md, cells, modes, concs)
	writeUpstreamRuns(&md, runs)
	writeAddedLatency(&md, cells, modes, concs)
	writeTargets(&md, cells, concs)

	if *mem != "" {
		if err := writeMem(&md, *mem, *runDir); err != nil {
			log.Fatal(err)
		}
	}
	if *profiles != "" {
		w("## Profiles (redis route, new key every request)\n\n")
		w("CPU and allocation profiles taken from the admin endpoint (`/debug/pprof`, 10 s each) of a fresh Caddy with the\n")
		w("same config and `GODEBUG=memprofilerate=16384` (allocation samples every 16 KiB), during a separate\n")
		w("load run (%s); the raw profiles and the binary are in `%s/` (`go tool pprof %s/caddy.bin %s/cpu.pprof`).\n\n",
			loadDesc(*runDir), *runDir, *runDir, *runDir)
		for _, p := range strings.Split(*profiles, ";") {
			title, file, ok := strings.Cut(p, "=")
			if !ok {
				continue
			}
			b, err := os.ReadFile(file)
			if err != nil {
				w("%s: missing (%v)\n\n", title, err)
				continue
			}
			w("### %s\n\n```\n%s\n```\n\n", title, strings.TrimRight(string(b), "\n"))
		}
	}
	if *notes != "" {
		if b, err := os.ReadFile(*notes); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			w("## Notes\n\n%s\n\n", strings.TrimSpace(string(b)))
		}
	}
	if *machine != "" {
		w("## Machine\n\n")
		b, err := os.ReadFile(*machine)
		if err != nil {
			log.Fatal(err)
		}
		w("| | |\n|---|---|\n")
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, _ := strings.Cut(line, "=")
			w("| %s | %s |\n", strings.TrimSpace(k), strings.TrimSpace(v))
		}
		w("\n")
	}
	if err := os.WriteFile(*out, []byte(md.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := chart(*png, cells, modes, routes, concs, modeTitle); err != nil {
		log.Fatal(err)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// orderRoutes puts the reference routes first.
func orderRoutes(routes []string) []string {
	rank := map[string]int{"proxy": 0, "baseline": 1, "baseline_cas": 2, "memory": 3, "redis": 4, "redis_unpipelined": 5, "redis_cached": 6,
		"baseline_pg": 7, "postgres": 8, "postgres_unpipelined": 9, "file": 10}
	sort.SliceStable(routes, func(i, j int) bool {
		ri, ok := rank[routes[i]]
		if !ok {
			ri = 99
		}
		rj, ok := rank[routes[j]]
		if !ok {
			rj = 99
		}
		return ri < rj
	})
	return routes
}

func readRuns(path string) ([]run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []run
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r run
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

func median(v []float64) float64 { return quantile(v, 0.5) }

func summarize(c *cell) {
	var rps, p50, p99, cpu, cpuCaddy, cpuStore, others []float64
	c.rpsMin = math.Inf(1)
	for _, r := range c.runs {
		rps = append(rps, r.RPS)
		p50 = append(p50, r.P50us)
		p99 = append(p99, r.P99us)
		cpu = append(cpu, r.CPUTotalUs)
		cpuCaddy = append(cpuCaddy, r.CPUus["caddy"])
		cpuStore = append(cpuStore, r.CPUStoreUs)
		others = append(others, r.OthersPct)
		c.rpsMin = math.Min(c.rpsMin, r.RPS)
		c.rpsMax = math.Max(c.rpsMax, r.RPS)
		c.errors += r.Errors
		c.unexpected += r.Unexpect
		c.requests += r.Requests
		c.replayed += r.Replayed
		if r.SeedError != "" {
			c.seedErr = r.SeedError
		}
	}
	c.rps, c.p50, c.p99, c.cpu, c.cpuCaddy = median(rps), median(p50), median(p99), median(cpu), median(cpuCaddy)
	c.cpuStore = median(cpuStore)
	c.others = median(others)
}

// pairedRatios is the median over rounds of c's figure over ref's figure
// in the same round.
func pairedRatios(c, ref *cell) ratios {
	byRound := map[int]run{}
	for _, r := range ref.runs {
		byRound[r.Round] = r
	}
	var rps, cpu, p99, p50, store []float64
	for _, r := range c.runs {
		b, ok := byRound[r.Round]
		if !ok {
			continue
		}
		if b.CPUStoreUs > 0 {
			store = append(store, r.CPUStoreUs/b.CPUStoreUs)
		}
		if b.RPS > 0 {
			rps = append(rps, r.RPS/b.RPS)
		}
		if b.CPUTotalUs > 0 {
			cpu = append(cpu, r.CPUTotalUs/b.CPUTotalUs)
		}
		if b.P99us > 0 {
			p99 = append(p99, r.P99us/b.P99us)
		}
		if b.P50us > 0 {
			p50 = append(p50, r.P50us/b.P50us)
		}
	}
	return ratios{median(rps), median(cpu), median(p99), median(store), median(p50), [2]float64{quantile(cpu, 0.25), quantile(cpu, 0.75)}}
}

// quantile is the q-quantile of v, interpolated between the closest ranks.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

// loadDesc describes the profiling load from profile-load.json beside the
// profiles, when it is there (dir is relative to the working directory,
// which run.sh sets to the repository).
func loadDesc(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "profile-load.json"))
	var r run
	if err != nil || json.Unmarshal(b, &r) != nil || r.Requests == 0 {
		return "new key every request"
	}
	return fmt.Sprintf("new key every request, %.0f req/s, p99 %.0f µs, %d errors", r.RPS, r.P99us, r.Errors+r.Unexpect)
}

func writeMem(md *strings.Builder, path, runDir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var rows []memResult
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var m memResult
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, m)
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintf(md, "## Memory: %d concurrent requests with 1 MiB responses\n\n", rows[0].N)
	fmt.Fprintf(md, "Each line is a fresh Caddy process (so VmHWM, its peak RSS from `/proc/<pid>/status`, starts from zero),\n")
	fmt.Fprintf(md, "hit by %d requests at once with distinct new keys, then by a second wave with the same keys (replays).\n\n", rows[0].N)
	fmt.Fprintf(md, "| variant | idle RSS | first wave: statuses | MiB received | s | peak RSS (VmHWM) | replay wave: statuses | peak RSS after replays |\n")
	fmt.Fprintf(md, "|---|---:|---|---:|---:|---:|---|---:|\n")
	for _, m := range rows {
		rs, rh := "–", "–"
		if m.Replay != nil {
			rs = fmtStatuses(*m.Replay)
			rh = fmt.Sprintf("%.0f MiB", float64(m.Replay.HWMkB)/1024)
		}
		fmt.Fprintf(md, "| %s | %.0f MiB | %s | %.0f | %.1f | %.0f MiB | %s | %s |\n",
			m.Label, float64(m.IdleRSSkB)/1024, fmtStatuses(m.First), float64(m.First.Bytes)/(1<<20), m.First.Seconds,
			float64(m.First.HWMkB)/1024, rs, rh)
	}
	fmt.Fprintf(md, "\n")
	for _, m := range rows {
		for _, wv := range []*wave{&m.First, m.Replay} {
			if wv == nil {
				continue
			}
			n5 := 0
			for s, n := range wv.Statuses {
				if strings.HasPrefix(s, "5") {
					n5 += n
				}
			}
			if n5 > 0 || wv.Errors > 0 {
				fmt.Fprintf(md, "⚠ %s: %d responses were 5xx and %d requests failed; the reasons are in `%s/caddy.*.log`.\n\n",
					m.Label, n5, wv.Errors, runDir)
				break
			}
		}
	}
	return nil
}

func fmtStatuses(w wave) string {
	var parts []string
	for s, n := range w.Statuses {
		parts = append(parts, fmt.Sprintf("%d×%s", n, s))
	}
	sort.Strings(parts)
	if w.Replayed > 0 {
		parts = append(parts, fmt.Sprintf("%d replayed", w.Replayed))
	}
	if w.Errors > 0 {
		parts = append(parts, fmt.Sprintf("%d errors (%s)", w.Errors, w.FirstErr))
	}
	return strings.Join(parts, ", ")
}

// ---------------------------------------------------------------- chart

var palette = []color.Color{
	color.RGBA{0x33, 0x33, 0x33, 0xff}, // proxy: dark grey
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, // baseline: blue
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, // memory: green
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, // redis: red
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, // postgres: purple
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, // file: orange
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, // baseline_cas: cyan
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, // baseline_pg: pink
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, // redis_cached: brown
	color.RGBA{0xbc, 0xbd, 0x22, 0xff}, // redis_unpipelined: olive
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, // postgres_unpipelined: grey
}

// routeColor keeps each known route's colour whichever routes ran.
func routeColor(route string, k int) color.Color {
	i, ok := map[string]int{"proxy": 0, "baseline": 1, "memory": 2, "redis": 3, "postgres": 4, "file": 5, "baseline_cas": 6,
		"baseline_pg": 7, "redis_cached": 8, "redis_unpipelined": 9, "postgres_unpipelined": 10}[route]
	if !ok {
		i = k
	}
	return palette[i%len(palette)]
}

var shapes = []draw.GlyphDrawer{
	draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.CrossGlyph{},
	draw.PlusGlyph{}, draw.RingGlyph{}, draw.BoxGlyph{},
}

func chart(path string, cells map[caseKey]map[string]*cell, modes, routes []string, concs []int, titles map[string]string) error {
	rows, cols := len(modes), 2
	plots := make([][]*plot.Plot, rows)
	thumbs := map[string][]plot.Thumbnailer{}
	for i, mode := range modes {
		plots[i] = make([]*plot.Plot, cols)
		for j := 0; j < cols; j++ {
			p := plot.New()
			p.X.Label.Text = "concurrency"
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = concTicks(concs)
			if j == 0 {
				p.Title.Text = mode + ": throughput"
				p.Y.Label.Text = "requests/s (median)"
				p.Y.Min = 0
			} else {
				p.Title.Text = mode + ": p99 latency"
				p.Y.Label.Text = "p99 ms (median, log scale)"
				p.Y.Scale = plot.LogScale{}
				p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			}
			p.Add(plotter.NewGrid())
			for k, route := range routes {
				var pts plotter.XYs
				for _, conc := range concs {
					c := cells[caseKey{mode, conc}][route]
					if c == nil {
						continue
					}
					y := c.rps
					if j == 1 {
						y = c.p99 / 1000
					}
					if y <= 0 || math.IsNaN(y) {
						continue
					}
					pts = append(pts, plotter.XY{X: float64(conc), Y: y})
				}
				if len(pts) == 0 {
					continue
				}
				line, scatter, err := plotter.NewLinePoints(pts)
				if err != nil {
					return err
				}
				col := routeColor(route, k)
				line.Color = col
				line.Width = vg.Points(1.5)
				scatter.Color = col
				scatter.Shape = shapes[k%len(shapes)]
				scatter.Radius = vg.Points(3)
				p.Add(line, scatter)
				if i == 0 && j == 0 {
					thumbs[route] = []plot.Thumbnailer{line, scatter}
				}
			}
			if j == 0 {
				p.Y.Max *= 1.05
			}
			// A log axis with one value (one concurrency, one p99) gets a
			// range around it: gonum would pad it by ±1, past zero.
			if p.X.Min == p.X.Max {
				p.X.Min, p.X.Max = p.X.Min/2, p.X.Max*2
			}
			if j == 1 && p.Y.Min == p.Y.Max {
				p.Y.Min, p.Y.Max = p.Y.Min/2, p.Y.Max*2
			}
			plots[i][j] = p
		}
	}
	legendH := vg.Points(28)
	width, height := vg.Points(1000), vg.Points(330*float64(rows))+legendH
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	// one legend for all panels, in a strip across the top
	strip := draw.Crop(dc, vg.Points(60), 0, height-legendH, 0)
	slot := (strip.Max.X - strip.Min.X) / vg.Length(len(routes))
	for k, route := range routes {
		if thumbs[route] == nil {
			continue
		}
		l := plot.NewLegend()
		l.Top, l.Left = true, true
		l.TextStyle.Font.Size = vg.Points(14)
		l.Add(route, thumbs[route]...)
		l.Draw(draw.Crop(strip, vg.Length(k)*slot, -(strip.Max.X - strip.Min.X - vg.Length(k+1)*slot), 0, -vg.Points(6)))
	}
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(12),
		PadTop: vg.Points(4), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8)}
	canvases := plot.Align(plots, t, draw.Crop(dc, 0, 0, 0, -legendH))
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// concTicks labels exactly the measured concurrency levels.
type concTicks []int

func (c concTicks) Ticks(min, max float64) []plot.Tick {
	var t []plot.Tick
	for _, v := range c {
		t = append(t, plot.Tick{Value: float64(v), Label: strconv.Itoa(v)})
	}
	return t
}
