package idempotency

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

var trueValue = []string{"true"}

// replay answers a request whose key already has a live record: with the
// stored response if the record is a completed one of this very request,
// else with the problem that says why not. A replay adds the stored
// headers after this exchange's own, as reverse_proxy adds an upstream's
// headers to those already set, and undoes a content coding that the
// retry does not accept.
func (a *attempt) replay(rec *store.Record) error {
	switch {
	case rec.Endpoint != a.claim.Endpoint:
		return a.refuse(problemOtherEndpoint)
	case rec.Fingerprint != a.claim.Fingerprint:
		return a.refuse(problemOtherPayload)
	case rec.State == store.InProgress:
		return a.refuse(problemOutstanding)
	case rec.OutcomeUnknown:
		return a.refuse(problemOutcomeUnknown)
	case rec.Truncated:
		return a.refuse(problemUnreplayable)
	}
	body, decoded := rec.Body, false
	bodyless := !bodyAllowed(rec.Status)
	if bodyless {
		// a record may hold one all the same (the recorder stores none),
		// which net/http would refuse
		body = nil
	} else if codings := rec.Header["Content-Encoding"]; len(codings) > 0 && !acceptsCodings(a.r.Header["Accept-Encoding"], codings) {
		if ok, err := a.awaitDecodeSlot(); !ok {
			return err
		}
		// held until the body is written: until then it is in memory
		defer func() { <-decodeSlots }()
		var ok bool
		if body, ok = decodeBody(codings, body); !ok {
			return a.refuse(problemNotAcceptable)
		}
		decoded = true
	}
	a.result(resultReplay)
	hdr := a.w.Header()
	trailers := replayHeader(hdr, rec.Header, decoded)
	hdr[a.h.ReplayHeader] = trueValue
	a.h.markReplay(hdr, rec.ExpiresAt)
	switch {
	case bodyless:
		// 1xx, 204 and 304: no body, so neither a length nor trailers
	case trailers != nil:
		// declared, and without a length, so that HTTP/1.1 sends it
		// chunked, with room for the trailers
		hdr["Trailer"] = []string{strings.Join(trailers, ", ")}
	default:
		hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	a.w.WriteHeader(rec.Status)
	if bodyless {
		return nil
	}
	if _, err := a.w.Write(body); err != nil {
		// the client left during a replay; it can retry again
		panic(http.ErrAbortHandler)
	}
	if trailers != nil {
		replayTrailers(a.w.Header(), rec.Header)
	}
	return nil
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

// Content codings on replay. An upstream behind reverse_proxy compresses
// for the client of the first request, which sent its Accept-Encoding; a
// retry may accept another coding or none. A stored body in a coding the
// retry does not accept is replayed decoded (gzip, deflate, zstd); one in
// a coding this handler cannot decode (br, ...) is refused with 406.

// maxDecodedBody bounds what a replay decodes into memory: a stored body
// is at most max_response_body, but compression can multiply it.
const maxDecodedBody = 64 << 20

// maxDecodes bounds the replays that hold a decoded body at once, in the
// whole process (memory is the process's, whatever the handler or config
// generation): each may hold maxDecodedBody, twice that as its buffer
// grows, until its client has read it, and nothing is cached, so fifty
// retries of one record would hold fifty copies. Four keep the worst case
// to a few hundred MiB and still use a small machine's cores, decoding
// being CPU work; a replay in a coding its retry accepts, the usual one,
// takes no slot.
const maxDecodes = 4

var decodeSlots = make(chan struct{}, maxDecodes)

// decodeWait is how long a replay waits for a decode slot before its
// client gets 503 and Retry-After (a variable for the tests): a decode
// takes a fraction of it, so a wait that runs out means slow readers
// hold the slots, and the client is better told to come back.
var decodeWait = time.Second

// awaitDecodeSlot takes a decode slot, waiting up to decodeWait while the
// client is there. It reports false once it has answered instead: 503
// when the wait ran out, 499 (for the access log) when the client left.
func (a *attempt) awaitDecodeSlot() (bool, error) {
	select {
	case decodeSlots <- struct{}{}:
		return true, nil
	case <-time.After(decodeWait):
		return false, a.refuse(problemReplayBusy)
	case <-a.r.Context().Done():
		a.result(resultGone)
		a.w.WriteHeader(statusClientClosed)
		return false, nil
	}
}

// acceptsCodings reports whether a request with the Accept-Encoding field
// lines accept takes a body with the Content-Encoding lines codings. A
// request without Accept-Encoding takes none: RFC 9110 would allow any,
// but such clients (curl, most scripts) cannot decode them.
func acceptsCodings(accept, codings []string) bool {
	for _, coding := range codingNames(codings) {
		if !acceptsCoding(accept, coding) {
			return false
		}
	}
	return true
}

// codingNames lists the codings of Content-Encoding lines, in the order
// they were applied, in lower case, without identity.
func codingNames(lines []string) (names []string) {
	for _, line := range lines {
		for coding := range strings.SplitSeq(line, ",") {
			if coding = strings.ToLower(strings.TrimSpace(coding)); coding != "" && coding != "identity" {
				names = append(names, coding)
			}
		}
	}
	return names
}

// acceptsCoding reports whether accept names coding, or *, with a
// non-zero weight; a coding named with q=0 is refused even under *.
func acceptsCoding(accept []string, coding string) bool {
	named, star := -1.0, -1.0
	for _, line := range accept {
		for member := range strings.SplitSeq(line, ",") {
			name, params, _ := strings.Cut(member, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "x-gzip" {
				name = "gzip"
			}
			q := weight(params)
			switch {
			case name == coding || (coding == "x-gzip" && name == "gzip"):
				named = max(named, q)
			case name == "*":
				star = max(star, q)
			}
		}
	}
	if named >= 0 {
		return named > 0
	}
	return star > 0
}

// weight is the q parameter in params, 1 when absent or malformed.
func weight(params string) float64 {
	for param := range strings.SplitSeq(params, ";") {
		name, value, _ := strings.Cut(param, "=")
		if strings.EqualFold(strings.TrimSpace(name), "q") {
			if q, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				return q
			}
		}
	}
	return 1
}

// decodeBody undoes the Content-Encoding lines codings of body, the last
// applied first. It reports false for a coding it cannot decode, a
// corrupt body, or one that decodes to more than maxDecodedBody.
func decodeBody(codings []string, body []byte) ([]byte, bool) {
	names := codingNames(codings)
	for i := len(names) - 1; i >= 0; i-- {
		var err error
		if body, err = decode(names[i], body); err != nil {
			return nil, false
		}
	}
	return body, true
}

func decode(coding string, body []byte) ([]byte, error) {
	var r io.Reader
	switch coding {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r = zr
	case "deflate":
		// HTTP's deflate is the zlib format; some servers send raw DEFLATE.
		zr, err := zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			r = flate.NewReader(bytes.NewReader(body))
		} else {
			r = zr
		}
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxDecodedBody))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	default:
		return nil, errUndecodable
	}
	var out bytes.Buffer
	n, err := io.Copy(&out, io.LimitReader(r, maxDecodedBody+1))
	switch {
	case err != nil:
		return nil, err
	case n > maxDecodedBody:
		return nil, errUndecodable
	}
	return out.Bytes(), nil
}

var errUndecodable = errors.New("content coding cannot be decoded")
