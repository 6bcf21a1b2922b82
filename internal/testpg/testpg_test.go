package testpg

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func run(t *testing.T, dsn, sql string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql).ReadAll()
	return err
}

func TestKillAndRestart(t *testing.T) {
	s := Start(t)
	if err := run(t, s.DSN(), "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatalf("using the fresh server: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	open, err := pgconn.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)

	s.Kill()
	if err := run(t, s.DSN(), "SELECT 1"); err == nil {
		t.Fatal("the killed server accepts sessions")
	}
	// A backend must die with its postmaster, as on a crashed host.
	if _, err := open.Exec(ctx, "SELECT 1").ReadAll(); err == nil {
		t.Fatal("a session opened before the kill still answers")
	}
	s.Restart(t)
	if err := run(t, s.DSN(), "SELECT n FROM kept"); err != nil {
		t.Fatalf("committed data lost across a restart: %v", err)
	}
}
