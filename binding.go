package idempotency

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultEndpoint is the Caddyfile's {method} {host}{path}. The host is
// taken without port, in lower case, so that api.example.com and
// api.example.com:443, or two instances on different ports, are one endpoint.
const defaultEndpoint = "{http.request.method} {http.request.host}{http.request.uri.path}"

// endpointOf expands the endpoint template, directly for the default one.
func endpointOf(template string, r *http.Request, repl *caddy.Replacer) string {
	if template == defaultEndpoint {
		return defaultEndpointOf(r.Method, r.Host, r.URL.Path)
	}
	return repl.ReplaceAll(template, "")
}

func defaultEndpointOf(method, hostport, path string) string {
	return method + " " + strings.ToLower(hostOnly(hostport)) + path
}

// hostOnly strips the port as {http.request.host} does ("[::1]:80" gives
// "::1"), without allocating net.SplitHostPort's error for a bare host.
func hostOnly(hostport string) string {
	if strings.HasPrefix(hostport, "[") {
		if i := strings.Index(hostport, "]:"); i > 0 {
			return hostport[1:i]
		}
		return hostport
	}
	if i := strings.IndexByte(hostport, ':'); i >= 0 && strings.IndexByte(hostport[i+1:], ':') < 0 {
		return hostport[:i]
	}
	return hostport
}

// boundTo reports whether rec was made by a request to the same endpoint
// with the same payload as c's: a retry of it, not another use of its key.
func boundTo(rec *store.Record, c *store.Claim) bool {
	return rec.Endpoint == c.Endpoint && rec.Fingerprint == c.Fingerprint
}
