package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// What a failed upstream leaves behind, against the built binary: each
// row of the README's table in Guarantees, under each option value.

// outcomeSite is proxySite with the transport options in transport (a
// block's body, may be empty).
func outcomeSite(u *upstream, options, transport string) string {
	return fmt.Sprintf(`route {
	idempotency {
%s
	}
	reverse_proxy %s {
		transport http {
%s
		}
	}
}`, options, u.host(), transport)
}

// The upstream reads the request and closes the connection without an
// answer: keep holds the key and tells the retry so; release runs it again.
func TestUnknownOutcomeConnectionClosed(t *testing.T) {
	t.Parallel()
	for _, opt := range []string{"release", "keep"} {
		t.Run(opt, func(t *testing.T) {
			t.Parallel()
			u := startUpstream(t)
			c := startCaddy(t, opt, outcomeSite(u, "on_unknown_outcome "+opt, ""))
			cl := newClient(t)
			pay := func() *http.Request {
				return req(http.MethodPost, c.URL+"/pay", "pay-1", []byte(`{"amount":100}`), hdrHangUp, "1")
			}
			first := send(t, cl, pay())
			wantStatus(t, "first request, connection closed by the upstream", first, http.StatusBadGateway)
			retry := send(t, cl, pay())
			if opt == "release" {
				wantStatus(t, "retry with release", retry, http.StatusBadGateway)
				wantCount(t, "upstream runs with release", u.starts("pay-1"), 2)
				return
			}
			wantProblem(t, "retry with keep", retry, http.StatusBadGateway, "outcome-unknown", false)
			if !strings.Contains(string(retry.Body), "may have been carried out") {
				t.Fatalf("the problem's detail does not say the request may have run: %s", retry)
			}
			wantCount(t, "upstream runs with keep", u.starts("pay-1"), 1)

			admin := fmt.Sprintf("127.0.0.1:%d", c.adminPort)
			metrics := get(t, "http://"+admin+"/metrics")
			if !strings.Contains(metrics, `caddy_idempotency_requests_total{result="unknown"} 1`) {
				t.Errorf("/metrics does not count the retry as unknown")
			}
			out := command(t, "inspect", "--address", admin, "--key", "pay-1")
			for _, want := range []string{"completed", "POST", "/pay", "outcome", "unknown"} {
				if !strings.Contains(out, want) {
					t.Errorf("inspect output lacks %q:\n%s", want, out)
				}
			}
			command(t, "purge", "--address", admin, "--key", "pay-1")
			after := send(t, cl, req(http.MethodPost, c.URL+"/pay", "pay-1", []byte(`{"amount":100}`)))
			wantStatus(t, "retry after the purge", after, http.StatusCreated)
			wantCount(t, "upstream runs after the purge", u.starts("pay-1"), 2)
		})
	}
}

// response_header_timeout passes: 504 to the first client, and the same
// two outcomes.
func TestUnknownOutcomeTimeout(t *testing.T) {
	t.Parallel()
	for _, opt := range []string{"release", "keep"} {
		t.Run(opt, func(t *testing.T) {
			t.Parallel()
			u := startUpstream(t)
			c := startCaddy(t, opt, outcomeSite(u, "on_unknown_outcome "+opt, "response_header_timeout 200ms"))
			cl := newClient(t)
			pay := func() *http.Request {
				return req(http.MethodPost, c.URL+"/pay", "slow-1", []byte(`{}`), hdrDelay, "3s")
			}
			wantStatus(t, "first request", send(t, cl, pay()), http.StatusGatewayTimeout)
			retry := send(t, cl, pay())
			if opt == "release" {
				wantStatus(t, "retry with release", retry, http.StatusGatewayTimeout)
				wantCount(t, "upstream runs with release", u.starts("slow-1"), 2)
				return
			}
			wantProblem(t, "retry with keep", retry, http.StatusBadGateway, "outcome-unknown", false)
			wantCount(t, "upstream runs with keep", u.starts("slow-1"), 1)
		})
	}
}

// The upstream answers 500: released by default, so the retry runs again;
// with store_server_errors, replayed.
func TestServerErrorAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, options string
		runs          int
	}{
		{"default", "", 2},
		{"store_server_errors", "store_server_errors", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := startUpstream(t)
			c := startCaddy(t, tc.name, proxySite(u, tc.options))
			cl := newClient(t)
			pay := func() *http.Request {
				return req(http.MethodPost, c.URL+"/pay", "err-1", []byte(`{}`), hdrStatus, "500,201")
			}
			first := send(t, cl, pay())
			wantStatus(t, "first request", first, http.StatusInternalServerError)
			retry := send(t, cl, pay())
			if tc.runs == 2 {
				wantStatus(t, "retry after a released 500", retry, http.StatusCreated)
			} else {
				wantReplay(t, "retry of a stored 500", first, retry)
			}
			wantCount(t, "upstream runs", u.starts("err-1"), tc.runs)
		})
	}
}

// The upstream's port is closed at the first request and open at the
// retry: the first never reached it, so even with keep the key was
// released, and the request runs once in all.
func TestClosedPortThenOpen(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, "caddy", fmt.Sprintf(`route {
	idempotency {
		on_unknown_outcome keep
	}
	reverse_proxy %s
}`, addr))
	cl := newClient(t)
	pay := func() *http.Request { return req(http.MethodPost, c.URL+"/pay", "port-1", []byte(`{}`)) }
	wantStatus(t, "first request to a closed port", send(t, cl, pay()), http.StatusBadGateway)

	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("opening the upstream's port: %v", err)
	}
	u := startUpstreamOn(t, l)
	wantStatus(t, "retry once the port is open", send(t, cl, pay()), http.StatusCreated)
	wantCount(t, "upstream runs", u.starts("port-1"), 1)
}

var keyHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

// header_up hands the upstream the scoped key's hash: 64 lowercase hex
// digits, the same on a retry after a release, another for another tenant.
func TestKeyPassedOn(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", fmt.Sprintf(`@writes {
	path /payments*
	method POST
}
route @writes {
	idempotency {
		required
		scope {http.request.header.X-Tenant}
	}
	reverse_proxy %[1]s {
		header_up Idempotency-Key {http.idempotency.key}
	}
}
route {
	idempotency
	reverse_proxy %[1]s {
		header_up Idempotency-Key {http.idempotency.key}
	}
}`, u.host()))
	cl := newClient(t)
	pay := func(tenant string) *http.Request {
		return req(http.MethodPost, c.URL+"/payments", "order-1", []byte(`{"amount":100}`),
			"X-Tenant", tenant, hdrStatus, "500,201")
	}
	acme, globex := store.NewKey("acme", "order-1").String(), store.NewKey("globex", "order-1").String()
	for _, k := range []string{acme, globex} {
		if !keyHash.MatchString(k) {
			t.Fatalf("scoped key %q is not 64 lowercase hex digits", k)
		}
	}

	wantStatus(t, "acme's first request", send(t, cl, pay("acme")), http.StatusInternalServerError)
	wantStatus(t, "acme's retry after the 500 released the key", send(t, cl, pay("acme")), http.StatusCreated)
	wantStatus(t, "globex's request with the same raw key", send(t, cl, pay("globex")), http.StatusInternalServerError)
	wantCount(t, "upstream runs under acme's scoped key", u.starts(acme), 2)
	wantCount(t, "upstream runs under globex's scoped key", u.starts(globex), 1)
	wantCount(t, "upstream runs under the raw key", u.starts("order-1"), 0)

	// Where the handler looks nothing up, the placeholder is unset and
	// header_up sends its text, as the README warns.
	wantStatus(t, "GET on the other route", send(t, cl, req(http.MethodGet, c.URL+"/orders", "order-1", nil)), http.StatusCreated)
	wantCount(t, "upstream runs under the placeholder's text", u.starts("{http.idempotency.key}"), 1)
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// command runs `caddy idempotency <args>` with the binary under test.
func command(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(caddyBin, append([]string{"idempotency"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("caddy idempotency %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
