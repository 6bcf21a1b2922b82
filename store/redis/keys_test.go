package redis

import (
	"context"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func TestKeysShareOneHashTag(t *testing.T) {
	srv := testredis.Start(t)
	s := storetest.Provision(t, &Store{Addresses: []string{srv.Addr()}, KeyPrefix: "app"})
	k := storetest.NewKey()
	want := "app:{" + k.String() + "}"
	if got := s.key(k); got != want {
		t.Fatalf("key = %q, want %q", got, want)
	}
	s.Acquire(context.Background(), k, claim())
	if n, err := srv.Client().Exists(context.Background(), want).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v", want, n, err)
	}
}

func TestGlobEscape(t *testing.T) {
	if got, want := globEscape(`a*b?c[d]e\f^g`), `a\*b\?c\[d\]e\\f\^g`; got != want {
		t.Fatalf("globEscape = %q, want %q", got, want)
	}
}
