package idempotency

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// The Caddyfile merges every site's handle_errors into the one server's
// error routes. A site's refusals go through them only where a route
// handles them: the other site keeps its problem+json answers, and the
// site with handle_errors still restyles what it lists.
func TestHandleErrorsOfAnotherSite(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{}, 4)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer app.Close()
	// A Redis address nothing listens on: the store is unavailable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9719
	https_port 9749
	grace_period 1ns
}
(site) {
	handle /down {
		idempotency {
			store redis {
				address %[2]s
				dial_timeout 1s
			}
		}
		reverse_proxy %[1]s
	}
	handle /missing {
		error "no such thing" 404
	}
	handle {
		idempotency {
			store memory
		}
		reverse_proxy %[1]s
	}
}
http://a.localhost:9719 {
	import site
	handle_errors 404 422 {
		respond "a restyled {http.error.status_code}"
	}
}
http://b.localhost:9719 {
	import site
}`, app.Listener.Addr(), dead), "caddyfile")

	send := func(site, path, key, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:9719"+path, strings.NewReader(body))
		req.Host = site + ".localhost:9719"
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	wantProblemAnswer := func(site string, resp *http.Response, body string, status int) {
		t.Helper()
		if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(body, fmt.Sprintf(`"status":%d`, status)) || resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("site %s: got %d %v %q, want the %d problem+json", site, resp.StatusCode, resp.Header, body, status)
		}
	}

	for _, site := range []string{"a", "b"} {
		// 409: a duplicate while the first request runs.
		done := make(chan struct{})
		go func() {
			defer close(done)
			send(site, "/slow", site+"-slow", "x")
		}()
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the slow request did not reach the upstream")
		}
		resp, body := send(site, "/slow", site+"-slow", "x")
		wantProblemAnswer(site, resp, body, http.StatusConflict)
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("site %s: the 409 lacks Retry-After", site)
		}

		// 503: the store is down.
		resp, body = send(site, "/down", site+"-down", "x")
		wantProblemAnswer(site, resp, body, http.StatusServiceUnavailable)

		// 422: the key reused with another body.
		if resp, _ := send(site, "/orders", site+"-k", "x"); resp.StatusCode != http.StatusCreated {
			t.Fatalf("site %s: first request got %d", site, resp.StatusCode)
		}
		resp, body = send(site, "/orders", site+"-k", "other")
		if site == "a" {
			if resp.StatusCode != http.StatusUnprocessableEntity || body != "a restyled 422" {
				t.Errorf("site a's own handle_errors 422: got %d %q", resp.StatusCode, body)
			}
		} else {
			wantProblemAnswer(site, resp, body, http.StatusUnprocessableEntity)
		}
		release <- struct{}{}
		<-done
	}

	// Site a's handle_errors still handles the other errors it lists.
	if resp, body := send("a", "/missing", "", ""); resp.StatusCode != http.StatusNotFound || body != "a restyled 404" {
		t.Errorf("site a's own 404: got %d %q", resp.StatusCode, body)
	}
}
