package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
)

// DefaultEndpoint is the Caddyfile's {method} {host}{path}. The host is
// taken without port, in lower case, so that api.example.com and
// api.example.com:443, or two instances on different ports, are one endpoint.
const DefaultEndpoint = "{http.request.method} {http.request.host}{http.request.uri.path}"

// maxEndpoint bounds what a claim and its record keep of the endpoint, so
// that a record's size does not grow with the path a client sends: with
// long paths, one client could otherwise push other callers' records out
// of a bounded store, or fill a shared one for a whole ttl.
const maxEndpoint = 256

// Endpoint expands the endpoint template, directly for the default one,
// and bounds it (keptEndpoint).
func Endpoint(template string, r *http.Request, repl *caddy.Replacer) string {
	if template == DefaultEndpoint {
		return keptEndpoint(defaultEndpointOf(r.Method, r.Host, r.URL.Path))
	}
	return keptEndpoint(repl.ReplaceAll(template, ""))
}

// keptEndpoint is e if it is at most maxEndpoint bytes, else its first
// bytes, still readable in listings, and the SHA-256 of the whole: equal
// endpoints are kept equal and different ones different, and nothing a
// client sends is refused for its length. A kept long endpoint is longer
// than maxEndpoint, so it never equals a short one kept as it is.
func keptEndpoint(e string) string {
	if len(e) <= maxEndpoint {
		return e
	}
	cut := maxEndpoint // not within a character, if e is UTF-8
	for range utf8.UTFMax - 1 {
		if utf8.RuneStart(e[cut]) {
			break
		}
		cut--
	}
	sum := sha256.Sum256([]byte(e))
	return e[:cut] + "...sha256:" + hex.EncodeToString(sum[:])
}

func defaultEndpointOf(method, hostport, path string) string {
	return method + " " + strings.ToLower(hostOnly(hostport)) + path
}

// hostOnly strips the port as {http.request.host} does ("[::1]:80" gives
// "::1"; a host without a port is kept as it is).
func hostOnly(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return host
}
