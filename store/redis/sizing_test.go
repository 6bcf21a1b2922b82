package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// BenchmarkMemoryPerRecord measures what one record costs in Redis memory:
// used_memory before and after writing sizingRecords records through the
// store, divided by their number. It is a measurement for the README's
// sizing, not a speed benchmark: run it once,
//
//	go test -run '^$' -bench MemoryPerRecord -benchtime 1x ./store/redis/
const sizingRecords = 100_000

func BenchmarkMemoryPerRecord(b *testing.B) {
	for _, tc := range storetest.SizingCases {
		b.Run(tc.Name, func(b *testing.B) {
			srv := testredis.Start(b)
			s := open(b, srv)
			before := usedMemory(b, srv)
			written := 0
			for b.Loop() {
				storetest.Fill(b, s, sizingRecords, tc.BodyLen, tc.ClaimsOnly, time.Hour, time.Hour)
				written += sizingRecords
			}
			if n := srv.Client().DBSize(context.Background()).Val(); n != int64(written) {
				b.Fatalf("%d keys in Redis, want %d", n, written)
			}
			per := float64(usedMemory(b, srv)-before) / float64(written)
			b.ReportMetric(per, "B/record")
			b.ReportMetric(float64(1<<30)/per, "records/GiB")
		})
	}
}

func usedMemory(tb testing.TB, srv *testredis.Server) int64 {
	tb.Helper()
	v := infoField(tb, srv, "memory", "used_memory")
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Fatalf("used_memory %q: %v", v, err)
	}
	return n
}

// infoField is one field of a section of the server's INFO.
func infoField(tb testing.TB, srv *testredis.Server, section, field string) string {
	tb.Helper()
	info, err := srv.Client().Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatalf("INFO %s: %v", section, err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return ""
}
