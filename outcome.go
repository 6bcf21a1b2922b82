package idempotency

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// What a claimed request that got no answer leaves behind. The gateway
// tells two kinds apart:
//
//   - It never reached an upstream: reverse_proxy could not dial any (a
//     DialError ends its attempts), or it selected none (no upstream was
//     available, or another handler failed first). Nothing ran, and the
//     claim is released whatever the options.
//   - It was sent, and no answer came: the connection broke, a timeout
//     (response_header_timeout: 504), the work was cancelled one lease
//     after its client left (reverse_proxy then writes 499), or any other
//     failure once an upstream was selected. The upstream may have acted:
//     on_unknown_outcome decides.
//
// reverse_proxy sets its upstream placeholders before each attempt, so
// their presence says that it selected one. A reverse_proxy that ran
// earlier in the route (forward_auth) has set them too: with keep, the
// earlier value is wrapped in earlierUpstream while the request runs, so
// that it is not taken for this request's upstream.
//
// What the gateway cannot see: with lb_retry_match covering the method,
// reverse_proxy itself may send a request to one upstream, lose the
// connection and try another; if that last attempt fails to dial, the
// request counts as never reached although the first upstream may have
// acted.
const upstreamPlaceholder = "http.reverse_proxy.upstream.address"

// earlierUpstream is the value an earlier reverse_proxy left in
// upstreamPlaceholder. It expands to the same text (caddy.ToString uses
// String), so logs and header templates see no difference.
type earlierUpstream struct{ value any }

func (e earlierUpstream) String() string { return caddy.ToString(e.value) }

// markEarlierUpstream wraps the upstream placeholder that an earlier
// reverse_proxy set, and reports whether there was one. Only keep needs
// to know whose upstream it is: with release, both kinds of failure end
// in a release, and the request pays nothing.
func markEarlierUpstream(repl *caddy.Replacer) bool {
	v, ok := repl.Get(upstreamPlaceholder)
	if ok {
		repl.Set(upstreamPlaceholder, earlierUpstream{v})
	}
	return ok
}

// unmarkEarlierUpstream puts back the earlier value if no reverse_proxy
// replaced it.
func unmarkEarlierUpstream(repl *caddy.Replacer) {
	if v, ok := repl.Get(upstreamPlaceholder); ok {
		if e, ok := v.(earlierUpstream); ok {
			repl.Set(upstreamPlaceholder, e.value)
		}
	}
}

// reachedUpstream reports whether a request that got no answer may have
// reached an upstream: reverse_proxy selected one for it, and its attempts
// did not end failing to dial.
func reachedUpstream(repl *caddy.Replacer, err error) bool {
	if errors.As(err, new(reverseproxy.DialError)) {
		return false
	}
	v, selected := repl.Get(upstreamPlaceholder)
	_, earlier := v.(earlierUpstream)
	return selected && !earlier
}
