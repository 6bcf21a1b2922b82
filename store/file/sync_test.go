//go:build linux

package file

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The floor under the store's write rate: what one synced write costs on
// the disk that b.TempDir() is on (put it on the disk of Caddy's data
// directory to measure that one). Each reports the median and the 99th
// percentile of its iterations beside the mean, since a sync's time
// varies with what else the disk is doing.

// latencies collects the time of each iteration.
type latencies []time.Duration

func (l *latencies) time(f func()) {
	start := time.Now()
	f()
	*l = append(*l, time.Since(start))
}

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	at := func(q float64) float64 { return float64(l[int(q*float64(len(l)-1))].Microseconds()) }
	b.ReportMetric(at(0.5), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkFdatasync rewrites one 4 KiB page of a file and syncs it, as
// bbolt does with fdatasync on Linux.
func BenchmarkFdatasync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "page"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	var l latencies
	for b.Loop() {
		l.time(func() {
			rand.Read(page[:16])
			if _, err := f.WriteAt(page, 0); err != nil {
				b.Fatal(err)
			}
			if err := syscall.Fdatasync(int(f.Fd())); err != nil {
				b.Fatal(err)
			}
		})
	}
	l.report(b)
}

func openBench(b *testing.B) *bolt.DB {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "bench.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(records); return err }); err != nil {
		b.Fatal(err)
	}
	return db
}

// put stores a new 32-byte key with a value the size of a small completed
// record.
func put(tx *bolt.Tx) error {
	k := make([]byte, 32)
	rand.Read(k)
	return tx.Bucket(records).Put(k, make([]byte, 200))
}

// BenchmarkBoltCommit commits one small put per transaction: two
// fdatasyncs, the pages then the meta page. One a key is the floor of a
// store that syncs each new key once, with one request at a time.
func BenchmarkBoltCommit(b *testing.B) {
	db := openBench(b)
	var l latencies
	for b.Loop() {
		l.time(func() {
			if err := db.Update(put); err != nil {
				b.Fatal(err)
			}
		})
	}
	l.report(b)
}

// BenchmarkGroupCommitPut is the same floor with 16 writers sharing
// commits through groupCommit, as the store's writes do: ns/op is the time
// per key, and each writer's wait is reported as latency.
func BenchmarkGroupCommitPut(b *testing.B) {
	g := &groupCommit{db: openBench(b)}
	var (
		mu  sync.Mutex
		all latencies
	)
	b.SetParallelism(8) // 16 goroutines on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		var l latencies
		for pb.Next() {
			l.time(func() {
				if err := g.update(put); err != nil {
					b.Error(err)
				}
			})
		}
		mu.Lock()
		all = append(all, l...)
		mu.Unlock()
	})
	all.report(b)
}
