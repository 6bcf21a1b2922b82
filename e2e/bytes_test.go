package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
)

// Any client can send a path that is not UTF-8 or holds NUL, and a
// fingerprint header with bytes that are not UTF-8. With the postgres store
// each is one request like any other: it runs once, its retry is a replay,
// and no store error is counted (PostgreSQL's text refuses such bytes).
func TestPostgresStoresAnyBytes(t *testing.T) {
	t.Parallel()
	pg := testpg.Start(t)
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, pgStore(pg, "e2e_bytes")+"\nfingerprint_headers X-Tenant"))
	cl := newClient(t)
	for i, path := range []string{"/a%00b", "/a%ffb", "/%ed%a0%80"} {
		key := fmt.Sprintf("bytes-%d", i)
		mk := func() *http.Request {
			return req(http.MethodPost, c.URL+path, key, []byte(`{}`), "X-Tenant", "caf\xe9")
		}
		first := send(t, cl, mk())
		wantStatus(t, "POST "+path, first, http.StatusCreated)
		wantReplay(t, "retry of POST "+path, first, send(t, cl, mk()))
		wantCount(t, "runs of POST "+path, u.starts(key), 1)
	}

	metrics := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", c.adminPort))
	if !strings.Contains(metrics, `caddy_idempotency_requests_total{result="replay"} 3`) {
		t.Errorf("/metrics does not count the 3 replays")
	}
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "caddy_idempotency_store_errors_total{") && !strings.HasSuffix(line, " 0") {
			t.Errorf("store errors counted: %s", line)
		}
	}
}
