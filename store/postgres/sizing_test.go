package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// BenchmarkTableSizePerRecord measures what one record costs on disk: the
// table's total size (heap, TOAST and indexes) after writing sizingRecords
// records through the store, divided by their number, as written (with the
// dead row versions that completing a claim leaves) and after a VACUUM
// FULL. It is a measurement for the README's sizing: run it once,
//
//	go test -run '^$' -bench TableSizePerRecord -benchtime 1x ./store/postgres/
const sizingRecords = 100_000

func BenchmarkTableSizePerRecord(b *testing.B) {
	for _, tc := range storetest.SizingCases {
		b.Run(tc.Name, func(b *testing.B) {
			table := newTable()
			s := storetest.Provision(b, &Store{DSN: shared.DSN(), Table: table, MaxConns: 16})
			written := 0
			for b.Loop() {
				storetest.Fill(b, s, sizingRecords, tc.BodyLen, tc.ClaimsOnly, time.Hour, time.Hour)
				written += sizingRecords
			}
			conn, err := pgx.Connect(context.Background(), shared.DSN())
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(context.Background())
			size := func() float64 {
				var n int64
				if err := conn.QueryRow(context.Background(), "SELECT pg_total_relation_size($1::regclass)", table).Scan(&n); err != nil {
					b.Fatal(err)
				}
				return float64(n) / float64(written)
			}
			b.ReportMetric(size(), "B/record")
			if _, err := conn.Exec(context.Background(), "VACUUM FULL "+table); err != nil {
				b.Fatal(err)
			}
			vacuumed := size()
			b.ReportMetric(vacuumed, "B/record_vacuumed")
			b.ReportMetric(float64(1<<30)/vacuumed, "records/GiB")
		})
	}
}
