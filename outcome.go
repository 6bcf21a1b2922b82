package idempotency

import (
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A claimed request that got no answer either never reached an upstream,
// and its claim is released whatever the options, or was sent and may have
// acted, and on_unknown_outcome decides:
//
//   - Never reached: reverse_proxy could not dial any upstream (a DialError
//     ends its attempts), or selected none (none was available, or another
//     handler failed first).
//   - Sent: the connection broke, a timeout (response_header_timeout: 504),
//     the work was cancelled one lease after its client left (499), or any
//     other failure once an upstream was selected.
//
// reverse_proxy sets its upstream placeholders before each attempt, so they
// say it selected one; with keep, an earlier reverse_proxy's value
// (forward_auth) is wrapped in earlierUpstream while the request runs.
// Blind spot: with lb_retry_match covering the method, a lost connection to
// one upstream then a failed dial to another counts as never reached,
// though the first upstream may have acted.
const upstreamPlaceholder = "http.reverse_proxy.upstream.address"

// earlierUpstream wraps an earlier reverse_proxy's upstreamPlaceholder; it
// expands to the same text (caddy.ToString uses String).
type earlierUpstream struct{ value any }

func (e earlierUpstream) String() string { return caddy.ToString(e.value) }

// markEarlierUpstream wraps an earlier reverse_proxy's placeholder and reports
// whether there was one; only keep needs it (release releases on both failures).
func markEarlierUpstream(repl *caddy.Replacer) bool {
	v, ok := repl.Get(upstreamPlaceholder)
	if ok {
		repl.Set(upstreamPlaceholder, earlierUpstream{v})
	}
	return ok
}

// unmarkEarlierUpstream restores the earlier value unless it was replaced.
func unmarkEarlierUpstream(repl *caddy.Replacer) {
	if v, ok := repl.Get(upstreamPlaceholder); ok {
		if e, ok := v.(earlierUpstream); ok {
			repl.Set(upstreamPlaceholder, e.value)
		}
	}
}

// reachedUpstream reports whether an unanswered request may have reached an
// upstream: one was selected, and no dial failure ended the attempts.
func reachedUpstream(repl *caddy.Replacer, err error) bool {
	if errors.As(err, new(reverseproxy.DialError)) {
		return false
	}
	v, selected := repl.Get(upstreamPlaceholder)
	_, earlier := v.(earlierUpstream)
	return selected && !earlier
}
