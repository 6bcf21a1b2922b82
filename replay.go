package idempotency

import (
	"bufio"
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

var (
	trueValue  = []string{"true"}
	falseValue = []string{"false"}
)

// What a client is told of its key on the answers that have a record:
// replay_header ... always marks first answers "false", expiry_header
// says when the record expires. Both are off by default; the recorder
// calls setFirstHeaders only when one is on.

// setsFirstHeaders says whether first answers get a header of their own.
func (h *Handler) setsFirstHeaders() bool { return h.ReplayHeaderAlways || h.ExpiryHeader != "" }

// setFirstHeaders sets the headers of a first answer with status, as it goes
// out: after the recorder has taken the header to store, so that a replay
// never carries them.
func (h *Handler) setFirstHeaders(hdr http.Header, status int) {
	if h.ReplayHeaderAlways {
		hdr[h.ReplayHeader] = falseValue
	}
	if h.ExpiryHeader != "" {
		// Only an answer that is stored has a record to expire. The record
		// is stored as the answer ends, so it expires a little after this.
		if end, _ := h.decideClaimEnd(responseFacts{wroteHeader: true, status: status}); end == endStore {
			hdr[h.expiryField] = []string{time.Now().Add(h.ttl).UTC().Format(http.TimeFormat)}
		}
	}
}

// setReplayHeaders sets the expiry of a replayed record: its own, as stored.
func (h *Handler) setReplayHeaders(hdr http.Header, expires time.Time) {
	if h.ExpiryHeader != "" && !expires.IsZero() {
		hdr[h.expiryField] = []string{expires.UTC().Format(http.TimeFormat)}
	}
}

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
	body, length := rec.Body, int64(len(rec.Body))
	bodyless := !bodyAllowed(rec.Status)
	// codings are those to undo for this retry, which does not accept them
	codings := rec.Header["Content-Encoding"]
	if bodyless {
		// a record may hold one all the same (the recorder stores none),
		// which net/http would refuse
		body, length, codings = nil, 0, nil
	} else if len(codings) > 0 && !acceptsCodings(a.r.Header["Accept-Encoding"], codings) {
		var ok bool
		var err error
		if length, ok, err = a.decodedLength(codings, body); !ok {
			return err
		}
	} else {
		codings = nil
	}
	decoded := codings != nil
	a.result(resultReplay)
	hdr := a.w.Header()
	trailers := replayHeader(hdr, rec.Header, decoded)
	hdr[a.h.ReplayHeader] = trueValue
	a.h.setReplayHeaders(hdr, rec.ExpiresAt)
	switch {
	case bodyless:
		// 1xx, 204 and 304: no body, so neither a length nor trailers
	case trailers != nil:
		// declared, and without a length, so that HTTP/1.1 sends it
		// chunked, with room for the trailers
		hdr["Trailer"] = []string{strings.Join(trailers, ", ")}
	default:
		hdr["Content-Length"] = []string{strconv.FormatInt(length, 10)}
	}
	a.w.WriteHeader(rec.Status)
	if bodyless {
		return nil
	}
	var err error
	if decoded {
		err = writeDecoded(a.w, codings, body, length)
	} else {
		_, err = a.w.Write(body)
	}
	if err != nil {
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

// maxDecodedBody bounds what a replay decodes: a stored body is at most
// max_response_body, but compression can multiply it.
const maxDecodedBody = 64 << 20

// A body is decoded twice: once to learn its length and that it decodes
// (else 406, before anything is sent), with nothing kept, and once as it
// is written, paced by the client, so that no replay holds a decoded body
// in memory and a client that reads slowly holds nothing another needs.

// maxDecodes bounds the first decodes that run at once in the process:
// each is CPU work, up to maxDecodedBody, and four use a small machine's
// cores without starving the rest. A replay in a coding its retry
// accepts, the usual one, takes no slot.
const maxDecodes = 4

var decodeSlots = make(chan struct{}, maxDecodes)

// decodeWait is how long a replay waits for a decode slot before its
// client gets 503 and Retry-After (a variable for the tests): a decode
// takes a fraction of it, so a wait that runs out means many decodes.
var decodeWait = time.Second

// decodedLength decodes body, in a decode slot, to learn its decoded
// length. It reports false once it has answered instead: 503 when no slot
// came free in time, 499 (for the access log) when the client left, 406
// when body cannot be decoded.
func (a *attempt) decodedLength(codings []string, body []byte) (int64, bool, error) {
	select {
	case decodeSlots <- struct{}{}:
	case <-time.After(decodeWait):
		return 0, false, a.refuse(problemReplayBusy)
	case <-a.r.Context().Done():
		a.result(resultGone)
		a.w.WriteHeader(statusClientClosed)
		return 0, false, nil
	}
	n, err := copyDecoded(io.Discard, codings, body, maxDecodedBody+1)
	<-decodeSlots
	if err != nil || n > maxDecodedBody {
		return 0, false, a.refuse(problemNotAcceptable)
	}
	return n, true, nil
}

// writeDecoded writes body decoded, its length known to be length.
func writeDecoded(w io.Writer, codings []string, body []byte, length int64) error {
	n, err := copyDecoded(w, codings, body, length)
	if err == nil && n != length {
		err = io.ErrUnexpectedEOF
	}
	return err
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

// copyDecoded writes to w at most limit bytes of body with the
// Content-Encoding lines codings undone, the last applied first.
func copyDecoded(w io.Writer, codings []string, body []byte, limit int64) (int64, error) {
	var r io.Reader = bytes.NewReader(body)
	names := codingNames(codings)
	for i := len(names) - 1; i >= 0; i-- {
		var err error
		var closer func()
		if r, closer, err = decoder(names[i], r); err != nil {
			return 0, err
		}
		defer closer()
	}
	return io.Copy(w, io.LimitReader(r, limit))
}

// decoder reads src with coding undone; close frees it.
func decoder(coding string, src io.Reader) (r io.Reader, close func(), err error) {
	switch coding {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(src)
		return zr, func() {}, err
	case "deflate":
		// HTTP's deflate is the zlib format; some servers send raw
		// DEFLATE: a zlib header is two bytes, told apart without reading on.
		br := bufio.NewReader(src)
		if head, err := br.Peek(2); err == nil && zlibHeader(head[0], head[1]) {
			zr, err := zlib.NewReader(br)
			return zr, func() {}, err
		}
		return flate.NewReader(br), func() {}, nil
	case "zstd":
		zr, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxDecodedBody))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return nil, nil, errUndecodable
}

var errUndecodable = errors.New("content coding cannot be decoded")

// zlibHeader reports whether cmf and flg open a zlib stream that
// compress/zlib reads: deflate with a window it takes, no preset
// dictionary, and a header checksum that holds.
func zlibHeader(cmf, flg byte) bool {
	return cmf&0x0f == 8 && cmf>>4 <= 7 && flg&0x20 == 0 && (uint16(cmf)<<8|uint16(flg))%31 == 0
}
