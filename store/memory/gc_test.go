//go:build unix

package memory

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// BenchmarkGCWithFullTable measures a full collection while the table holds
// its default 100,000 completed records: what the GC pays, on every cycle,
// to mark the records kept live.
func BenchmarkGCWithFullTable(b *testing.B) {
	m, _ := fullTable(b)
	runtime.GC()
	// The process's CPU time is reported too: wall time varies with what
	// else the machine runs, since the collection runs on every core.
	cpu0 := cpuTime()
	n := 0
	for b.Loop() {
		runtime.GC()
		n++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(n), "cpu-ns/op")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapObjects), "heap-objects")
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
	// Let go of the table now: the testing package keeps this run's
	// cleanups, and so m, reachable into the next -count run, whose
	// collections would then mark two tables.
	m.Cleanup()
	m.tab = nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
