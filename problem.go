package idempotency

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// docsURL anchors problem types in the README, which documents each answer;
// the IETF draft asks a deployment to link its own idempotency policy.
const docsURL = "https://github.com/caddy-idempotency/caddy-idempotency#"

// problem is an RFC 9457 problem details answer, rendered once at provision
// time so that refusing a request costs no encoding.
type problem struct {
	status             int
	typ, title, detail string
	retryAfter         []string
	body               []byte
	routes             *errorRoutes // shared by a handler's problems
}

// Error makes a problem an error for Caddy's error routes; the message is
// the detail, which {http.error.message} then shows.
func (p *problem) Error() string { return p.detail }

func newProblem(status int, anchor, title, detail string, retryAfter int) *problem {
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{docsURL + anchor, title, status, detail})
	if err != nil {
		panic(err) // only strings and an int: cannot fail
	}
	p := &problem{status: status, typ: docsURL + anchor, title: title, detail: detail, body: body}
	if retryAfter > 0 {
		p.retryAfter = []string{strconv.Itoa(retryAfter)}
	}
	return p
}

var (
	problemContentType = []string{"application/problem+json"}
	noSniff            = []string{"nosniff"}
	// noStore keeps every cache between the client and Caddy from keeping
	// a refusal: a retry must reach the handler, which may answer it
	// otherwise (the first request has ended, the store is back).
	noStore = []string{"no-store"}
)

// answer sends p: as the problem+json body, or through the server's
// handle_errors routes where one answers it, with the problem's parts in
// placeholders. The Caddyfile merges every site's handle_errors into the
// server's one list, and where no route answers, Caddy writes a bare
// status: so the routes run here, and when none wrote an answer (another
// site's routes, or this site's for other statuses), the problem is.
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
	w.Header()["Cache-Control"] = noStore
	if p.retryAfter != nil {
		w.Header()["Retry-After"] = p.retryAfter
	}
	aw := &answerWatcher{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, status: p.status}
	err := p.routes.of(srv).ServeHTTP(aw, srv.Errors.WithError(r, caddyhttp.Error(p.status, p)))
	if err == nil && !aw.answered {
		p.write(w)
	}
	return err
}

// errorRoutes is a server's error routes compiled, kept for the last
// server a handler's refusals met (a handler serves in one server; a
// reload provisions new handlers).
type errorRoutes struct {
	last atomic.Pointer[compiledRoutes]
}

type compiledRoutes struct {
	srv   *caddyhttp.Server
	chain caddyhttp.Handler
}

// noAnswer ends the error routes without writing, so that answer writes
// the problem.
var noAnswer = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

func (e *errorRoutes) of(srv *caddyhttp.Server) caddyhttp.Handler {
	if e == nil { // a problem made outside newProblems
		return srv.Errors.Routes.Compile(noAnswer)
	}
	if c := e.last.Load(); c != nil && c.srv == srv {
		return c.chain
	}
	c := &compiledRoutes{srv: srv, chain: srv.Errors.Routes.Compile(noAnswer)}
	e.last.Store(c)
	return c.chain
}

// answerWatcher tells an error route's answer from none. A terminal
// route that matched (a site's handle_errors for other statuses) ends in
// Caddy's errorEmptyHandler, which writes the bare status: so the problem's
// own status, until a body follows, is held back and counts as no answer.
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

// answer sends the held status, once something else shows that a route
// answered.
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

// FlushError is what http.ResponseController calls: the held status goes
// first.
func (a *answerWatcher) FlushError() error {
	a.answer()
	return http.NewResponseController(a.ResponseWriterWrapper.ResponseWriter).Flush()
}

func (p *problem) write(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = problemContentType
	h["X-Content-Type-Options"] = noSniff
	h["Content-Length"] = []string{strconv.Itoa(len(p.body))}
	h["Cache-Control"] = noStore
	if p.retryAfter != nil {
		h["Retry-After"] = p.retryAfter
	}
	w.WriteHeader(p.status)
	w.Write(p.body)
}

// problems holds every answer a handler gives on its own; their details
// name the handler's configured key header.
type problems struct {
	missing, invalid, repeated     *problem
	missingScope                   *problem
	tooLarge                       *problem
	outstanding                    *problem
	otherEndpoint, otherPayload    *problem
	unreplayable, storeUnavailable *problem
	outcomeUnknown                 *problem
	notAcceptable                  *problem
	unreadable                     *problem
}

func newProblems(header string, maxRequestBody int64) problems {
	ps := problems{
		missing: newProblem(400, "missing-key", "Idempotency-Key is missing",
			"This operation is idempotent and requires the "+header+" request header.", 0),
		invalid: newProblem(400, "invalid-key", "Idempotency-Key is invalid",
			"The "+header+" header must be 1 to 255 visible ASCII characters, bare (without a comma) or as a quoted string.", 0),
		repeated: newProblem(400, "invalid-key", "Idempotency-Key is invalid",
			"The "+header+" header must appear exactly once.", 0),
		missingScope: newProblem(401, "missing-scope", "The caller of this Idempotency-Key is unknown",
			"Idempotency keys are kept per caller, and this request names none. Authenticate and retry with the same key.", 0),
		tooLarge: newProblem(413, "request-too-large", "Request body too large",
			"An idempotent request body may be at most "+strconv.FormatInt(maxRequestBody, 10)+" bytes.", 0),
		outstanding: newProblem(409, "outstanding", "A request is outstanding for this Idempotency-Key",
			"The first request with this key is still being processed. Retry later with the same key.", 1),
		otherEndpoint: newProblem(422, "key-reused", "Idempotency-Key is already used",
			"This key was used for a request to another endpoint. Use a new key for a new operation.", 0),
		otherPayload: newProblem(422, "key-reused", "Idempotency-Key is already used",
			"This key was used for a request with a different payload. Use a new key for a new operation.", 0),
		unreplayable: newProblem(409, "unreplayable", "The response for this Idempotency-Key cannot be replayed",
			"The request with this key was processed, but its response was too large or incomplete to be stored. Do not retry it; look the result up instead.", 0),
		storeUnavailable: newProblem(503, "store-unavailable", "Idempotency store unavailable",
			"The request was not processed because its idempotency could not be guaranteed. Retry later with the same key.", 2),
		outcomeUnknown: newProblem(502, "outcome-unknown", "The outcome of the request for this Idempotency-Key is unknown",
			"The request with this key was sent to the server, which did not answer: it may have been carried out. Do not retry it; check whether it took effect before sending it again with a new key.", 0),
		notAcceptable: newProblem(406, "not-acceptable", "The response for this Idempotency-Key is in an encoding this request does not accept",
			"The request with this key was processed, and its response is stored in a content coding that cannot be decoded here. Retry with that coding in Accept-Encoding.", 0),
		unreadable: newProblem(500, "unreadable-record", "The stored response for this Idempotency-Key cannot be read",
			"The request with this key was processed, but its stored response cannot be decrypted by this server. It will not run again; do not resend it with a new key before checking whether it took effect.", 0),
	}
	// One cache of the compiled error routes for all of them.
	routes := new(errorRoutes)
	for _, p := range []*problem{ps.missing, ps.invalid, ps.repeated, ps.missingScope, ps.tooLarge, ps.outstanding,
		ps.otherEndpoint, ps.otherPayload, ps.unreplayable, ps.storeUnavailable, ps.outcomeUnknown} {
		p.routes = routes
	}
	return ps
}
