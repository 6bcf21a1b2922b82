package idempotency

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// forward_key hands the upstream the scoped key hash on the requests the
// handler protects, and no client's copy on any request of the route.
// The header_up recipe it replaces sends its placeholder's literal text
// on the requests the handler passes through.
func TestForwardKey(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // "path method" -> the headers the upstream got
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path+" "+r.Method] = append(seen[r.URL.Path+" "+r.Method],
			fmt.Sprintf("%q %q", r.Header.Values("X-Upstream-Key"), r.Header.Values("Idempotency-Key")))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer app.Close()

	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9717
	https_port 9747
	grace_period 1ns
}
http://localhost:9717 {
	route /pay {
		idempotency {
			scope {http.request.header.X-Tenant}
			forward_key X-Upstream-Key
			store memory
		}
		reverse_proxy %[1]s
	}
	route /own {
		idempotency {
			forward_key Idempotency-Key
			store memory
		}
		reverse_proxy %[1]s
	}
	route /recipe {
		idempotency {
			store memory
		}
		reverse_proxy %[1]s {
			header_up X-Upstream-Key {http.idempotency.key}
		}
	}
}`, app.Listener.Addr()), "caddyfile")

	send := func(method, path, key string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://localhost:9717"+path, strings.NewReader("x"))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set("X-Upstream-Key", "chosen-by-the-client")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		tester.AssertResponseCode(req, http.StatusCreated)
	}
	want := func(path, method, got string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		all := seen[path+" "+method]
		if len(all) == 0 || all[len(all)-1] != got {
			t.Errorf("%s %s: the upstream got X-Upstream-Key and Idempotency-Key %v, want %s", method, path, all, got)
		}
	}
	hash := store.NewKey("acme", "order-1").String()

	send("POST", "/pay", "order-1")
	want("/pay", "POST", fmt.Sprintf(`["%s"] ["order-1"]`, hash))
	send("POST", "/pay", "") // keyless, passed through
	want("/pay", "POST", `[] []`)
	send("GET", "/pay", "order-1") // another method, passed through
	want("/pay", "GET", `[] ["order-1"]`)

	// Naming the key header itself replaces the client's key.
	send("POST", "/own", "order-1")
	want("/own", "POST", fmt.Sprintf(`["chosen-by-the-client"] ["%s"]`, store.NewKey("", "order-1")))
	send("GET", "/own", "order-1")
	want("/own", "GET", `["chosen-by-the-client"] []`)

	// The old recipe: right on a protected request, the placeholder's
	// literal text (the same for every client) on one passed through.
	send("POST", "/recipe", "order-2")
	want("/recipe", "POST", fmt.Sprintf(`["%s"] ["order-2"]`, store.NewKey("", "order-2")))
	send("GET", "/recipe", "order-2")
	want("/recipe", "GET", `["{http.idempotency.key}"] ["order-2"]`)
}
