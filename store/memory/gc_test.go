//go:build unix

package memory

import (
	"context"
	"net/http"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// BenchmarkGCWithFullTable measures a full collection while the table holds
// its default 100,000 completed records: what the GC pays, on every cycle,
// to mark the records kept live.
func BenchmarkGCWithFullTable(b *testing.B) {
	m := storetest.Provision(b, &Memory{MaxEntries: 100_000, MaxBytes: 1 << 30})
	ctx := context.Background()
	body := make([]byte, 200)
	for range 100_000 {
		k, c := storetest.NewKey(), &store.Claim{Token: storetest.NewToken(), Endpoint: "POST api.example.com/orders", Lease: time.Minute}
		if _, err := m.Acquire(ctx, k, c); err != nil {
			b.Fatal(err)
		}
		rec := &store.Record{Status: 201, Body: body, Header: http.Header{
			"Content-Type":  {"application/json"},
			"Location":      {"/orders/0f8fad5b-d9cb-469f-a165-70867728950e"},
			"X-Request-Id":  {"b5d4c1f0a2e3"},
			"Cache-Control": {"no-store"},
		}}
		if err := m.Complete(ctx, k, c, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
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
