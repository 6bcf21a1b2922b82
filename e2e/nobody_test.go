package e2e

import (
	"fmt"
	"net/http"
	"testing"
)

// Caddy's respond "x" 204 writes a body that net/http refuses: its client
// gets a clean 204, and so must every retry, replayed whole.
func TestNoBodyStatusReplay(t *testing.T) {
	t.Parallel()
	c := startCaddy(t, "nobody", `route /no-content {
	idempotency
	respond "x" 204
}
route /not-modified {
	idempotency
	header ETag "\"v7\""
	respond "x" 304
}`)
	cl := newClient(t)
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/no-content", http.StatusNoContent},
		{"/not-modified", http.StatusNotModified},
	} {
		post := func() *http.Request {
			return req(http.MethodPost, c.URL+tc.path, "nobody"+tc.path, []byte(`{"sku":"tea"}`))
		}
		first := send(t, cl, post())
		wantStatus(t, "first request to "+tc.path, first, tc.status)
		if first.replayed() || len(first.Body) != 0 {
			t.Fatalf("first request to %s: %s; want a fresh answer without a body", tc.path, first)
		}
		for i := range 3 {
			what := fmt.Sprintf("retry %d to %s", i, tc.path)
			retry, err := do(cl, post())
			if err != nil {
				t.Fatalf("%s: %v: the replay aborted", what, err)
			}
			wantStatus(t, what, retry, tc.status)
			if !retry.replayed() || len(retry.Body) != 0 || retry.Header.Get("Content-Length") != "" {
				t.Fatalf("%s: %s; want the replayed %d without a body or a length", what, retry, tc.status)
			}
		}
	}
}
