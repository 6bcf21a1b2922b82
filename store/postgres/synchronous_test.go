package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// The store's statements run under its synchronous_commit: every
// connection of its pool, the ones its claims and completions used
// included, reports the level; a store without it has the server's.
func TestSynchronousCommit(t *testing.T) {
	for _, tc := range []struct{ level, want string }{
		{"remote_apply", "remote_apply"},
		{"off", "off"},
		{"", "on"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			s := storetest.Provision(t, &Store{DSN: shared.DSN(), Table: newTable(), SynchronousCommit: tc.level, MaxConns: 4})
			ctx := context.Background()
			// Claims and completions in parallel, so that the pool opens
			// several connections.
			errs := make(chan error, 8)
			for range 8 {
				go func() {
					k, c := storetest.NewKey(), claim(time.Minute)
					if _, err := s.Acquire(ctx, k, c); err != nil {
						errs <- err
						return
					}
					errs <- s.Complete(ctx, k, c, &store.Response{Status: 201, Body: []byte("x")}, time.Minute)
				}()
			}
			for range 8 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			conns := s.db.pool.AcquireAllIdle(ctx)
			if len(conns) == 0 {
				t.Fatal("the pool has no connections")
			}
			for _, conn := range conns {
				var got string
				err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got)
				conn.Release()
				if err != nil || got != tc.want {
					t.Errorf("SHOW synchronous_commit on one of the store's %d connections = %q, %v; want %q", len(conns), got, err, tc.want)
				}
			}
		})
	}
}
