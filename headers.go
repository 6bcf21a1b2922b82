package idempotency

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// What of a response's header is stored, and how a replay puts it back.
// The handlers before this one (header, CORS) set headers for each
// exchange: they set them again for the retry, so only what the handlers
// after this one added or changed is stored (exchangeHeader). A replay
// adds the stored values after this exchange's own, as reverse_proxy adds
// an upstream's headers to those already set (replayHeader).

// unstorableHeaders are never stored or replayed: cookies and
// authentication answers belong to the caller who received them, and the
// rest describe one connection or are recomputed on replay.
var unstorableHeaders = map[string]bool{
	"Set-Cookie":                true,
	"Set-Cookie2":               true,
	"Authentication-Info":       true,
	"Proxy-Authentication-Info": true,
	"Proxy-Authenticate":        true,
	"Connection":                true,
	"Keep-Alive":                true,
	"Transfer-Encoding":         true,
	"Upgrade":                   true,
	"Trailer":                   true,
	"Date":                      true,
	"Content-Length":            true,
	"Alt-Svc":                   true,
}

// exchangeHeader is what h holds beyond outer, the header as the handlers
// before this one left it: the names they did not set, whole; for the names
// they set, the values appended after theirs, or the whole list if it was
// replaced. It is nil when there is nothing to store.
func exchangeHeader(h, outer http.Header) http.Header {
	var out http.Header
	for name, values := range h {
		if unstorableHeaders[name] || len(values) == 0 {
			continue
		}
		if old, ok := outer[name]; ok && len(values) >= len(old) && slices.Equal(values[:len(old)], old) {
			if values = values[len(old):]; len(values) == 0 {
				continue
			}
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[name] = values
	}
	return out
}

// addTrailers adds to rec's stored header the trailers set after the body,
// under net/http's TrailerPrefix convention, which every store keeps as a
// header name: the names the Trailer header declared, and the names
// already written with the prefix.
func (rec *recorder) addTrailers() {
	h := rec.ResponseWriter.Header()
	add := func(name string, values []string) {
		if rec.header == nil {
			rec.header = make(http.Header)
		}
		rec.header[name] = values
	}
	for _, line := range rec.declared {
		for name := range strings.SplitSeq(line, ",") {
			name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			if values := h[name]; len(values) > 0 && name != "" {
				add(http.TrailerPrefix+name, values)
			}
		}
	}
	for name, values := range h {
		if strings.HasPrefix(name, http.TrailerPrefix) && len(values) > 0 {
			add(name, values)
		}
	}
}

// replayHeader puts the stored header into dst, this exchange's header,
// leaving out trailers and, when the body is replayed decoded,
// Content-Encoding. It reports the stored trailers' names.
func replayHeader(dst, stored http.Header, decoded bool) (trailers []string) {
	for name, values := range stored {
		if after, ok := strings.CutPrefix(name, http.TrailerPrefix); ok {
			trailers = append(trailers, after)
			continue
		}
		if decoded && name == "Content-Encoding" {
			continue
		}
		// Clip the slices: a later handler appending to a header must not
		// write into a record that other replays share.
		values = values[:len(values):len(values)]
		if own := dst[name]; len(own) > 0 {
			values = append(own[:len(own):len(own)], values...)
		}
		dst[name] = values
	}
	return trailers
}

// replayTrailers sets the stored trailers once the body is written; the
// server sends what carries the prefix as trailers.
func replayTrailers(dst, stored http.Header) {
	for name, values := range stored {
		if strings.HasPrefix(name, http.TrailerPrefix) {
			dst[name] = values[:len(values):len(values)]
		}
	}
}
