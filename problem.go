package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"

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

// answer sends p: as the problem+json body, or, when the server has
// handle_errors routes, as an error those routes restyle, with the
// problem's parts in placeholders.
func (p *problem) answer(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer) error {
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok &&
		srv.Errors != nil && len(srv.Errors.Routes) > 0 {
		repl.Set("http.idempotency.problem.type", p.typ)
		repl.Set("http.idempotency.problem.title", p.title)
		repl.Set("http.idempotency.problem.detail", p.detail)
		repl.Set("http.idempotency.problem.body", string(p.body))
		w.Header()["Cache-Control"] = noStore
		if p.retryAfter != nil {
			w.Header()["Retry-After"] = p.retryAfter
		}
		return caddyhttp.Error(p.status, p)
	}
	p.write(w)
	return nil
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
}

func newProblems(header string, maxRequestBody int64) problems {
	return problems{
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
	}
}
