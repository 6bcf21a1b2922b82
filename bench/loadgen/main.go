// Command loadgen drives the benchmark routes of bench/run.sh.
//
//	loadgen bench    fixed-duration rounds over several routes, alternated,
//	                 with the CPU time of Caddy and the stores read from /proc
//	loadgen run      one fixed-duration load on one URL (for profiling)
//	loadgen mem      N concurrent requests at once, peak RSS from /proc
//	loadgen freeport print a free loopback TCP port
//
// Every request is a POST with a small JSON body and an Idempotency-Key.
// Key modes: new (a fresh key every request), replay (every request sends
// one key stored before the run starts), mix (each worker alternates
// between the two, so half the requests are new and half replays).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen bench|run|mem|order|freeport [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "bench":
		err = benchCmd(os.Args[2:])
	case "run":
		err = runCmd(os.Args[2:])
	case "mem":
		err = memCmd(os.Args[2:])
	case "order":
		err = orderCmd(os.Args[2:])
	case "freeport":
		err = freePortCmd()
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

var requestBody = []byte(`{"sku":"tea","qty":1}`)

// ---------------------------------------------------------------- load

type loadSpec struct {
	URL      string
	Mode     string // new, replay, mix
	Conc     int
	Warmup   time.Duration
	Duration time.Duration
	KeyBase  string // unique per run
	// ReplayKeys is how many stored keys the replays ask for, worker w
	// the (w mod ReplayKeys)th; 0 or 1: one key for every worker.
	ReplayKeys int
	// Upstream (host:port) counts the runs of Route: see upstreamRuns.
	Upstream, Route string
	// at the edges of the measured window; may be nil
	onStart, onEnd func()
}

type loadResult struct {
	Requests  int            `json:"requests"`   // completed inside the window
	Errors    int            `json:"errors"`     // transport errors inside the window
	Unexpect  int            `json:"unexpected"` // status other than 201 inside the window
	Statuses  map[string]int `json:"statuses"`
	Replayed  int            `json:"replayed"` // responses with Idempotent-Replayed: true
	Seconds   float64        `json:"seconds"`
	RPS       float64        `json:"rps"`
	P50us     float64        `json:"p50_us"`
	P90us     float64        `json:"p90_us"`
	P99us     float64        `json:"p99_us"`
	MaxUs     float64        `json:"max_us"`
	FirstErr  string         `json:"first_error,omitempty"`
	SeedError string         `json:"seed_error,omitempty"`
	// Over the whole load, warm-up included: the requests sent with a
	// fresh key and answered, and how many times the upstream ran the
	// route meanwhile (-1: not counted). Each new key runs once, and no
	// replay runs: the two are equal.
	NewKeys      int `json:"new_keys"`
	UpstreamRuns int `json:"upstream_runs"`
}

func newClient(conc int) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conc * 2,
		MaxIdleConnsPerHost: conc * 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type sample struct {
	status   int
	replayed bool
	err      error
}

func post(ctx context.Context, c *http.Client, url, key string) sample {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(requestBody))
	if err != nil {
		return sample{err: err}
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Idempotency-Key"] = []string{key}
	resp, err := c.Do(req)
	if err != nil {
		return sample{err: err}
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return sample{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", err: err}
}

type workerStats struct {
	newKeys  int
	lat      []time.Duration
	errors   int
	statuses map[int]int
	replayed int
	firstErr error
}

// load runs spec.Conc workers for Warmup+Duration and measures the requests
// that complete inside the last Duration.
func load(spec loadSpec) loadResult {
	client := newClient(spec.Conc)
	defer client.CloseIdleConnections()
	ctx := context.Background()
	seedKeys := make([]string, max(spec.ReplayKeys, 1))
	for i := range seedKeys {
		seedKeys[i] = spec.KeyBase + "-seed-" + strconv.Itoa(i)
	}
	var res loadResult
	if spec.Mode != "new" {
		// store the keys that the replays ask for, before the clock starts,
		// a few at a time
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, k := range seedKeys {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if s := post(ctx, client, spec.URL, k); s.err != nil || s.status != http.StatusCreated {
					mu.Lock()
					res.SeedError = fmt.Sprintf("seeding key: status %d err %v", s.status, s.err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}

	runsBefore := upstreamRuns(spec.Upstream, spec.Route)

	// The window is kept as nanoseconds since epoch (monotonic clock);
	// t1 stays 0 while the window is open.
	epoch := time.Now()
	var stop atomic.Bool
	var t0ns, t1ns atomic.Int64
	t0ns.Store(-1) // not measuring yet

	stats := make([]*workerStats, spec.Conc)
	var wg sync.WaitGroup
	for w := 0; w < spec.Conc; w++ {
		ws := &workerStats{statuses: map[int]int{}, lat: make([]time.Duration, 0, 4096)}
		stats[w] = ws
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			prefix := spec.KeyBase + "-" + strconv.Itoa(w) + "-"
			seedKey := seedKeys[w%len(seedKeys)]
			for i := 0; !stop.Load(); i++ {
				key := seedKey
				switch spec.Mode {
				case "new":
					key = prefix + strconv.Itoa(i)
				case "mix":
					if i%2 == 0 {
						key = prefix + strconv.Itoa(i)
					}
				}
				start := time.Since(epoch)
				s := post(ctx, client, spec.URL, key)
				end := time.Since(epoch)
				if key != seedKey && s.err == nil {
					ws.newKeys++
				}
				t0, t1 := t0ns.Load(), t1ns.Load()
				if t0 < 0 || int64(end) < t0 || (t1 != 0 && int64(end) > t1) {
					continue
				}
				if s.err != nil {
					ws.errors++
					if ws.firstErr == nil {
						ws.firstErr = s.err
					}
					continue
				}
				ws.lat = append(ws.lat, end-start)
				ws.statuses[s.status]++
				if s.replayed {
					ws.replayed++
				}
			}
		}(w)
	}

	time.Sleep(spec.Warmup)
	if spec.onStart != nil {
		spec.onStart()
	}
	t0ns.Store(int64(time.Since(epoch)))
	time.Sleep(spec.Duration)
	t1ns.Store(int64(time.Since(epoch)))
	if spec.onEnd != nil {
		spec.onEnd()
	}
	stop.Store(true)
	wg.Wait()
	res.UpstreamRuns = -1
	if runsBefore >= 0 {
		if after := upstreamRuns(spec.Upstream, spec.Route); after >= 0 {
			res.UpstreamRuns = int(after - runsBefore)
		}
	}

	var all []time.Duration
	res.Statuses = map[string]int{}
	for _, ws := range stats {
		all = append(all, ws.lat...)
		res.Errors += ws.errors
		res.Replayed += ws.replayed
		res.NewKeys += ws.newKeys
		for st, n := range ws.statuses {
			res.Statuses[strconv.Itoa(st)] += n
			if st != http.StatusCreated {
				res.Unexpect += n
			}
		}
		if ws.firstErr != nil && res.FirstErr == "" {
			res.FirstErr = ws.firstErr.Error()
		}
	}
	res.Requests = len(all)
	res.Seconds = time.Duration(t1ns.Load() - t0ns.Load()).Seconds()
	res.RPS = float64(res.Requests) / res.Seconds
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	res.P50us = micros(percentile(all, 0.50))
	res.P90us = micros(percentile(all, 0.90))
	res.P99us = micros(percentile(all, 0.99))
	if len(all) > 0 {
		res.MaxUs = micros(all[len(all)-1])
	}
	return res
}

// upstreamRuns is how many requests of route the upstream at addr has run,
// from its /_runs; -1 without an upstream or an answer.
func upstreamRuns(addr, route string) int64 {
	if addr == "" || route == "" {
		return -1
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/_runs")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var counts map[string]int64
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		return -1
	}
	return counts[route]
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// ---------------------------------------------------------------- /proc

// procTicks is the CPU time of pid and all its descendants, in clock
// ticks: utime+stime of each live process plus cutime+cstime, the time of
// its children that exited and that it reaped. PostgreSQL forks a backend
// per connection, and the postmaster's own utime+stime holds none of them:
// the live backends count through the walk, and a backend that exits
// during the window moves its whole time into the postmaster's cutime and
// cstime when reaped, so the sum over the tree stays whole across exits.
func procTicks(pid int) int64 {
	var total int64
	for _, p := range append([]int{pid}, descendants(pid)...) {
		if t, ok := procStat(p); ok {
			total += t.utime + t.stime + t.cutime + t.cstime
		}
	}
	return total
}

func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, ok := procStat(p); ok {
			children[t.ppid] = append(children[t.ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// procTimes is what procStat reads of /proc/<pid>/stat.
type procTimes struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// procStat reads ppid and the CPU times of pid. Fields count from the end
// of the command name, which may hold spaces and parentheses.
func procStat(pid int) (procTimes, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procTimes{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procTimes{}, false
	}
	var t procTimes
	t.ppid, _ = strconv.Atoi(f[1])
	t.utime, _ = strconv.ParseInt(f[11], 10, 64)
	t.stime, _ = strconv.ParseInt(f[12], 10, 64)
	t.cutime, _ = strconv.ParseInt(f[13], 10, 64)
	t.cstime, _ = strconv.ParseInt(f[14], 10, 64)
	return t, true
}

// machineBusyTicks is the non-idle time of all CPUs from /proc/stat:
// user, nice, system, irq, softirq and steal (guest time is inside user).
func machineBusyTicks() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return busy
}

// procStatusKB reads a "Name:   N kB" line of /proc/pid/status.
func procStatusKB(pid int, name string) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				n, _ := strconv.ParseInt(fields[0], 10, 64)
				return n
			}
		}
	}
	return -1
}

// ---------------------------------------------------------------- bench

type namedPID struct {
	name string
	pid  int
}

func parsePIDs(s string) ([]namedPID, error) {
	var out []namedPID
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("pid %q is not name=pid", part)
		}
		pid, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("pid %q: %v", part, err)
		}
		out = append(out, namedPID{name, pid})
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		out = append(out, f)
	}
	return out
}

type runRecord struct {
	Mode       string             `json:"mode"`
	Conc       int                `json:"conc"`
	Route      string             `json:"route"`
	Round      int                `json:"round"`
	Position   int                `json:"position"` // place of the route in its round
	CPUTicks   map[string]int64   `json:"cpu_ticks"`
	CPUus      map[string]float64 `json:"cpu_us_per_req"` // per process group
	CPUStoreUs float64            `json:"cpu_store_us_per_req"`
	// OthersPct is the CPU that processes other than the benchmark's
	// (Caddy, stores, upstream, load generator) used during the window, in
	// percent of the machine: the noise from other work on a shared host.
	OthersPct  float64 `json:"others_cpu_pct"`
	CPUTotalUs float64 `json:"cpu_total_us_per_req"` // caddy + stores
	loadResult
}

func benchCmd(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	base := fs.String("base", "", "Caddy base URL, e.g. http://127.0.0.1:8080")
	routes := fs.String("routes", "proxy,baseline,memory,redis", "route names; each is served under /<name>/")
	modes := fs.String("modes", "new,replay,mix", "key modes")
	concs := fs.String("conc", "1,16,64,256", "concurrency levels")
	duration := fs.Duration("duration", 2*time.Second, "measured time per run")
	warmup := fs.Duration("warmup", 500*time.Millisecond, "unmeasured time before each run")
	rounds := fs.Int("rounds", 3, "rounds per case; each round runs every route once")
	replayKeys := fs.Int("replay-keys", 1, "stored keys the replays ask for, spread over the workers (replay and mix modes)")
	pids := fs.String("pids", "", "processes whose CPU time is read, name=pid,...; 'caddy' is Caddy, the rest are stores (descendants and reaped children included)")
	otherPids := fs.String("other-pids", "", "more processes of the benchmark (upstream), name=pid,...; read but not counted per request")
	clkTck := fs.Int("clk-tck", 100, "clock ticks per second (getconf CLK_TCK)")
	redisAddr := fs.String("redis", "", "Redis to FLUSHALL before each case (keeps memory flat)")
	upstream := fs.String("upstream", "", "the upstream's host:port, whose /_runs counts each route's runs")
	out := fs.String("out", "results.jsonl", "JSON lines output, appended")
	_ = fs.Parse(args)
	if *base == "" {
		return errors.New("-base is required")
	}
	procs, err := parsePIDs(*pids)
	if err != nil {
		return err
	}
	others, err := parsePIDs(*otherPids)
	if err != nil {
		return err
	}
	others = append(others, namedPID{"loadgen", os.Getpid()})
	ncpu := runtime.NumCPU()
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	rl := splitList(*routes)
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	tick := float64(time.Second/time.Microsecond) / float64(*clkTck)

	var concList []int
	for _, c := range splitList(*concs) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("bad concurrency %q", c)
		}
		concList = append(concList, n)
	}
	for _, mode := range splitList(*modes) {
		if mode != "new" && mode != "replay" && mode != "mix" {
			return fmt.Errorf("bad mode %q", mode)
		}
		for _, conc := range concList {
			if *redisAddr != "" {
				if err := flushRedis(*redisAddr); err != nil {
					return fmt.Errorf("flushing redis: %w", err)
				}
			}
			for round := 0; round < *rounds; round++ {
				order := roundOrder(len(rl), round)
				for pos := range rl {
					route := rl[order[pos]]
					before := map[string]int64{}
					after := map[string]int64{}
					var oursBefore, oursAfter, busyBefore, busyAfter int64
					spec := loadSpec{
						URL:        strings.TrimRight(*base, "/") + "/" + route + "/orders",
						Mode:       mode,
						Conc:       conc,
						Warmup:     *warmup,
						Duration:   *duration,
						KeyBase:    fmt.Sprintf("%s-%s-%s-c%d-r%d", runID, route, mode, conc, round),
						Upstream:   *upstream,
						Route:      route,
						ReplayKeys: *replayKeys,
						onStart: func() {
							busyBefore = machineBusyTicks()
							for _, p := range procs {
								before[p.name] = procTicks(p.pid)
								oursBefore += before[p.name]
							}
							for _, p := range others {
								oursBefore += procTicks(p.pid)
							}
						},
						onEnd: func() {
							busyAfter = machineBusyTicks()
							for _, p := range procs {
								after[p.name] = procTicks(p.pid)
								oursAfter += after[p.name]
							}
							for _, p := range others {
								oursAfter += procTicks(p.pid)
							}
						},
					}
					res := load(spec)
					rec := runRecord{Mode: mode, Conc: conc, Route: route, Round: round, Position: pos,
						CPUTicks: map[string]int64{}, CPUus: map[string]float64{}, loadResult: res}
					for _, p := range procs {
						d := after[p.name] - before[p.name]
						rec.CPUTicks[p.name] = d
						if res.Requests > 0 {
							us := float64(d) * tick / float64(res.Requests)
							rec.CPUus[p.name] = us
							rec.CPUTotalUs += us
							if p.name != "caddy" {
								rec.CPUStoreUs += us
							}
						}
					}
					if capacity := float64(ncpu) * float64(*clkTck) * res.Seconds; capacity > 0 {
						foreign := float64((busyAfter - busyBefore) - (oursAfter - oursBefore))
						rec.OthersPct = max(0, 100*foreign/capacity)
					}
					if err := enc.Encode(rec); err != nil {
						return err
					}
					flag := ""
					if res.Errors > 0 || res.Unexpect > 0 || res.SeedError != "" {
						flag = fmt.Sprintf("  !! errors=%d unexpected=%d statuses=%v %s %s", res.Errors, res.Unexpect, res.Statuses, res.FirstErr, res.SeedError)
					}
					if res.UpstreamRuns >= 0 && res.UpstreamRuns != res.NewKeys {
						flag += fmt.Sprintf("  !! the upstream ran %d times for %d new keys", res.UpstreamRuns, res.NewKeys)
					}
					fmt.Fprintf(os.Stderr, "%-6s c=%-3d round %d %-9s %8.0f req/s  p50 %7.0fus  p99 %7.0fus  cpu %6.1fus/req  others %3.0f%%  replayed %5.1f%%%s\n",
						mode, conc, round+1, route, res.RPS, res.P50us, res.P99us, rec.CPUTotalUs, rec.OthersPct,
						100*float64(res.Replayed)/float64(max(res.Requests, 1)), flag)
				}
			}
		}
	}
	return nil
}

// flushRedis sends FLUSHALL over RESP.
func flushRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "*1\r\n$8\r\nFLUSHALL\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+OK") {
		return fmt.Errorf("FLUSHALL answered %q", strings.TrimSpace(line))
	}
	return nil
}

// ---------------------------------------------------------------- run

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	url := fs.String("url", "", "URL to POST to")
	mode := fs.String("mode", "new", "new, replay or mix")
	conc := fs.Int("conc", 64, "concurrency")
	duration := fs.Duration("duration", 10*time.Second, "measured time")
	warmup := fs.Duration("warmup", 500*time.Millisecond, "unmeasured time first")
	replayKeys := fs.Int("replay-keys", 1, "stored keys the replays ask for, spread over the workers (replay and mix modes)")
	_ = fs.Parse(args)
	if *url == "" {
		return errors.New("-url is required")
	}
	res := load(loadSpec{URL: *url, Mode: *mode, Conc: *conc, Warmup: *warmup, Duration: *duration,
		KeyBase: "run-" + strconv.FormatInt(time.Now().UnixNano(), 36), ReplayKeys: *replayKeys})
	return json.NewEncoder(os.Stdout).Encode(res)
}

// ---------------------------------------------------------------- mem

type wave struct {
	OK       int            `json:"ok"`
	Errors   int            `json:"errors"`
	FirstErr string         `json:"first_error,omitempty"`
	Statuses map[string]int `json:"statuses"`
	Replayed int            `json:"replayed"`
	Bytes    int64          `json:"bytes"`
	Seconds  float64        `json:"seconds"`
	HWMkB    int64          `json:"vm_hwm_kb"`  // VmHWM after the wave
	MaxRSSkB int64          `json:"max_rss_kb"` // highest VmRSS sampled during the wave
	EndRSSkB int64          `json:"end_rss_kb"` // VmRSS after the wave
}

type memResult struct {
	Label     string `json:"label"`
	URL       string `json:"url"`
	N         int    `json:"n"`
	IdleRSSkB int64  `json:"idle_rss_kb"`
	First     wave   `json:"first"`
	Replay    *wave  `json:"replay,omitempty"`
}

func memCmd(args []string) error {
	fs := flag.NewFlagSet("mem", flag.ExitOnError)
	url := fs.String("url", "", "URL to POST to")
	n := fs.Int("n", 500, "concurrent requests")
	pid := fs.Int("pid", 0, "Caddy's pid")
	label := fs.String("label", "", "label for the report")
	replay := fs.Bool("replay", true, "send a second wave with the same keys")
	_ = fs.Parse(args)
	if *url == "" || *pid == 0 {
		return errors.New("-url and -pid are required")
	}
	res := memResult{Label: *label, URL: *url, N: *n, IdleRSSkB: procStatusKB(*pid, "VmRSS")}
	client := newClient(*n)
	keyBase := "mem-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	res.First = memWave(client, *url, keyBase, *n, *pid)
	if *replay {
		w := memWave(client, *url, keyBase, *n, *pid)
		res.Replay = &w
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func memWave(client *http.Client, url, keyBase string, n, pid int) wave {
	w := wave{Statuses: map[string]int{}}
	var mu sync.Mutex
	var maxRSS atomic.Int64
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if v := procStatusKB(pid, "VmRSS"); v > maxRSS.Load() {
				maxRSS.Store(v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	startGate := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-startGate
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(requestBody))
			req.Header.Set("Idempotency-Key", keyBase+"-"+strconv.Itoa(i))
			resp, err := client.Do(req)
			var nb int64
			if err == nil {
				nb, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				w.Errors++
				if w.FirstErr == "" {
					w.FirstErr = err.Error()
				}
				return
			}
			w.OK++
			w.Bytes += nb
			w.Statuses[strconv.Itoa(resp.StatusCode)]++
			if resp.Header.Get("Idempotent-Replayed") == "true" {
				w.Replayed++
			}
		}(i)
	}
	start := time.Now()
	close(startGate)
	wg.Wait()
	w.Seconds = time.Since(start).Seconds()
	close(done)
	w.HWMkB = procStatusKB(pid, "VmHWM")
	w.MaxRSSkB = maxRSS.Load()
	w.EndRSSkB = procStatusKB(pid, "VmRSS")
	return w
}

// ---------------------------------------------------------------- freeport

func freePortCmd() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println(l.Addr().(*net.TCPAddr).Port)
	return nil
}
