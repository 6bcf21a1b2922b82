package idempotency

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// problem is an RFC 9457 problem details answer, rendered at provision so
// that refusing costs no encoding.
type problem struct {
	status             int
	typ, title, detail string
	result             result // what the refusal counts as
	retryAfter         []string
	challenge          []string // WWW-Authenticate, of a 401
	body               []byte
	routes             *errorRoutes // shared by a handler's problems
}

// Error gives Caddy's error routes the detail as {http.error.message}.
func (p *problem) Error() string { return p.detail }

var (
	problemContentType = []string{"application/problem+json"}
	noSniff            = []string{"nosniff"}
	english            = []string{"en"} // the titles and details
	// noStore keeps caches from keeping a refusal: a retry may be answered
	// otherwise (the first request has ended, the store is back).
	noStore = []string{"no-store"}
)

// answer sends p through the server's handle_errors routes, its parts in
// placeholders, or as problem+json when no route answers: the Caddyfile
// merges every site's handle_errors into one list, and where none answers
// Caddy would write a bare status.
func (p *problem) answer(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv.Errors == nil || len(srv.Errors.Routes) == 0 {
		p.write(w)
		return nil
	}
	repl.Set("http.idempotency.problem.type", p.typ)
	repl.Set("http.idempotency.problem.title", p.title)
	repl.Set("http.idempotency.problem.detail", p.detail)
	repl.Set("http.idempotency.problem.body", string(p.body))
	p.setHeaders(w.Header())
	aw := &answerWatcher{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, status: p.status}
	err := p.routes.of(srv).ServeHTTP(aw, srv.Errors.WithError(r, caddyhttp.Error(p.status, p)))
	if err == nil && !aw.answered {
		p.write(w)
	}
	return err
}

// errorRoutes caches the compiled error routes of the last server seen (a
// handler serves in one server; a reload provisions new handlers).
type errorRoutes struct {
	last atomic.Pointer[compiledRoutes]
}

type compiledRoutes struct {
	srv   *caddyhttp.Server
	chain caddyhttp.Handler
}

// noAnswer ends the error routes without writing, so the problem is.
var noAnswer = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

func (e *errorRoutes) of(srv *caddyhttp.Server) caddyhttp.Handler {
	if c := e.last.Load(); c != nil && c.srv == srv {
		return c.chain
	}
	c := &compiledRoutes{srv: srv, chain: srv.Errors.Routes.Compile(noAnswer)}
	e.last.Store(c)
	return c.chain
}

// answerWatcher tells an error route's answer from none. A matched route
// for other statuses ends in Caddy's errorEmptyHandler, writing the bare
// status: so the problem's own status is held back until a body follows.
type answerWatcher struct {
	*caddyhttp.ResponseWriterWrapper
	status   int  // the problem's
	held     bool // WriteHeader(status) was held back
	answered bool
}

func (a *answerWatcher) WriteHeader(status int) {
	if !a.answered && status == a.status {
		a.held = true
		return
	}
	a.answered = true
	a.ResponseWriterWrapper.WriteHeader(status)
}

// answer sends the held status once a route shows it answered.
func (a *answerWatcher) answer() {
	if a.held {
		a.held = false
		a.ResponseWriterWrapper.WriteHeader(a.status)
	}
	a.answered = true
}

func (a *answerWatcher) Write(b []byte) (int, error) {
	a.answer()
	return a.ResponseWriterWrapper.Write(b)
}

func (a *answerWatcher) ReadFrom(r io.Reader) (int64, error) {
	a.answer()
	return a.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError (called by http.ResponseController) sends the held status.
func (a *answerWatcher) FlushError() error {
	a.answer()
	return http.NewResponseController(a.ResponseWriterWrapper.ResponseWriter).Flush()
}

func (p *problem) write(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = problemContentType
	h["Content-Language"] = english
	h["X-Content-Type-Options"] = noSniff
	h["Content-Length"] = []string{strconv.Itoa(len(p.body))}
	p.setHeaders(h)
	w.WriteHeader(p.status)
	w.Write(p.body)
}

// setHeaders sets the headers of every answer of p, by a route or not.
func (p *problem) setHeaders(h http.Header) {
	h["Cache-Control"] = noStore
	if p.retryAfter != nil {
		h["Retry-After"] = p.retryAfter
	}
	if p.challenge != nil {
		h["Www-Authenticate"] = p.challenge
	}
}

// problemKind names each answer the handler gives on its own.
type problemKind uint8

const (
	problemMissingKey problemKind = iota
	problemInvalidKey
	problemRepeatedKey
	problemMissingScope
	problemTooLarge
	problemOutstanding
	problemOtherEndpoint
	problemOtherPayload
	problemUnreplayable
	problemStoreUnavailable
	problemOutcomeUnknown
	problemNotAcceptable
	problemUnreadable
	problemReplayBusy
	numProblems
)

// problemTable is every answer the handler gives on its own. In details,
// {where} and {what} name where the key is read (the key header, by
// default), {min} is min_key_length and {max} max_request_body.
var problemTable = [numProblems]struct {
	status        int
	anchor        string
	title, detail string
	retryAfter    int
	result        result
}{
	problemMissingKey: {400, "missing-key", "Idempotency-Key is missing",
		"This operation is idempotent and requires {where}.", 0, resultInvalid},
	problemInvalidKey: {400, "invalid-key", "Idempotency-Key is invalid",
		"{what} must be {min} to 255 visible ASCII characters, bare (without a comma) or as a quoted string.", 0, resultInvalid},
	problemRepeatedKey: {400, "invalid-key", "Idempotency-Key is invalid",
		"{what} must appear exactly once.", 0, resultInvalid},
	problemMissingScope: {401, "missing-scope", "The caller of this Idempotency-Key is unknown",
		"Idempotency keys are kept per caller, and this request names none. Authenticate and retry with the same key.", 0, resultMissingScope},
	problemTooLarge: {413, "request-too-large", "Request body too large",
		"An idempotent request body may be at most {max} bytes.", 0, resultTooLarge},
	problemOutstanding: {409, "outstanding", "A request is outstanding for this Idempotency-Key",
		"The first request with this key is still being processed. Retry later with the same key.", 1, resultConflict},
	problemOtherEndpoint: {422, "key-reused", "Idempotency-Key is already used",
		"This key was used for a request to another endpoint. Use a new key for a new operation.", 0, resultMismatch},
	problemOtherPayload: {422, "key-reused", "Idempotency-Key is already used",
		"This key was used for a request with a different payload. Use a new key for a new operation.", 0, resultMismatch},
	problemUnreplayable: {409, "unreplayable", "The response for this Idempotency-Key cannot be replayed",
		"The request with this key was processed, but its response was too large or incomplete to be stored. Do not retry it; look the result up instead.", 0, resultUnreplayable},
	problemStoreUnavailable: {503, "store-unavailable", "Idempotency store unavailable",
		"The request was not processed because its idempotency could not be guaranteed. Retry later with the same key.", 2, resultError},
	problemOutcomeUnknown: {502, "outcome-unknown", "The outcome of the request for this Idempotency-Key is unknown",
		"The request with this key was sent to the server, which did not answer: it may have been carried out. Do not retry it; check whether it took effect before sending it again with a new key.", 0, resultUnknown},
	problemNotAcceptable: {406, "not-acceptable", "The response for this Idempotency-Key is in an encoding this request does not accept",
		"The request with this key was processed, and its response is stored in a content coding that cannot be decoded here. Retry with that coding in Accept-Encoding.", 0, resultNotAcceptable},
	problemUnreadable: {500, "unreadable-record", "The stored response for this Idempotency-Key cannot be read",
		"The request with this key was processed, but its stored response cannot be decrypted by this server. It will not run again; do not resend it with a new key before checking whether it took effect.", 0, resultUnreadable},
	problemReplayBusy: {503, "replay-busy", "The response for this Idempotency-Key cannot be replayed right now",
		"The request with this key was processed, and its stored response must be decoded for this request, which does not accept its content coding, but too many are being decoded at once. Retry shortly with the same key, or accept gzip, deflate and zstd.", 1, resultReplayBusy},
}

// problems are a handler's answers, sharing one cache of its error routes.
type problems [numProblems]*problem

func newProblems(base string, key *keySource, minKey int, maxRequestBody int64) problems {
	fill := strings.NewReplacer("{where}", key.where, "{what}", key.what, "{min}", strconv.Itoa(minKey), "{max}", strconv.FormatInt(maxRequestBody, 10))
	routes := new(errorRoutes)
	var ps problems
	for kind, t := range problemTable {
		detail := fill.Replace(t.detail)
		body, err := json.Marshal(struct {
			Type   string `json:"type"`
			Title  string `json:"title"`
			Status int    `json:"status"`
			Detail string `json:"detail"`
		}{base + "#" + t.anchor, t.title, t.status, detail})
		if err != nil {
			panic(err) // only strings and an int: cannot fail
		}
		p := &problem{status: t.status, typ: base + "#" + t.anchor, title: t.title, detail: detail,
			result: t.result, body: body, routes: routes}
		if t.retryAfter > 0 {
			p.retryAfter = []string{strconv.Itoa(t.retryAfter)}
		}
		ps[kind] = p
	}
	return ps
}
