package idempotency

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultEndpoint binds a key to the method, host and path of its first
// request: the Caddyfile's {method} {host}{path}. The host is taken
// without its port and in lower case, so that one API reached as
// api.example.com and api.example.com:443, or through two instances on
// different ports, is one endpoint.
const defaultEndpoint = "{http.request.method} {http.request.host}{http.request.uri.path}"

// endpointOf is what a key is bound to besides its payload: the
// expansion of the endpoint template for r, computed directly for the
// default one (no placeholder expansion on the hot path).
func endpointOf(template string, r *http.Request, repl *caddy.Replacer) string {
	if template == defaultEndpoint {
		return defaultEndpointOf(r.Method, r.Host, r.URL.Path)
	}
	return repl.ReplaceAll(template, "")
}

func defaultEndpointOf(method, hostport, path string) string {
	return method + " " + strings.ToLower(hostOnly(hostport)) + path
}

// hostOnly strips the port from a Host value the way Caddy's
// {http.request.host} does ("[::1]:80" gives "::1", "h:443" gives "h"),
// without the allocation of net.SplitHostPort's error for a host that has
// no port.
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
