package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// forward_key hands the upstream the scoped key's hash in place of the
// client's key, on a retry after a release too, and on a request the
// handler passes through the upstream gets no key at all: neither the
// client's nor a placeholder's text.
func TestForwardKeyPassedOn(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", fmt.Sprintf(`idempotency {
	scope {http.request.header.X-Tenant}
	forward_key Idempotency-Key
}
reverse_proxy %s`, u.host()))
	cl := newClient(t)
	pay := func(tenant string) *http.Request {
		return req(http.MethodPost, c.URL+"/payments", "order-7", []byte(`{"amount":100}`),
			"X-Tenant", tenant, hdrStatus, "500,201")
	}
	acme, globex := store.NewKey("acme", "order-7").String(), store.NewKey("globex", "order-7").String()

	wantStatus(t, "acme's first request", send(t, cl, pay("acme")), http.StatusInternalServerError)
	wantStatus(t, "acme's retry after the 500 released the key", send(t, cl, pay("acme")), http.StatusCreated)
	wantStatus(t, "globex's request with the same raw key", send(t, cl, pay("globex")), http.StatusInternalServerError)
	wantCount(t, "upstream runs under acme's scoped key", u.starts(acme), 2)
	wantCount(t, "upstream runs under globex's scoped key", u.starts(globex), 1)

	wantStatus(t, "GET with a key, passed through", send(t, cl, req(http.MethodGet, c.URL+"/orders", "order-7", nil)), http.StatusCreated)
	wantCount(t, "upstream runs under the raw key", u.starts("order-7"), 0)
	wantCount(t, "upstream runs under the placeholder's text", u.starts("{http.idempotency.key}"), 0)
	wantCount(t, "upstream runs without a key (the GET)", u.starts(""), 1)
}
