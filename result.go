package idempotency

// result is what became of a request: the value of the
// {http.idempotency.result} placeholder and the result label of
// caddy_idempotency_requests_total, both named in results.
type result uint8

const (
	resultNew           result = iota // this request claimed the key and ran
	resultReplay                      // answered from the store
	resultConflict                    // refused: the first request is still running
	resultMismatch                    // refused: the key belongs to another request
	resultBypass                      // no key on a route that does not require one
	resultInvalid                     // refused: missing, malformed or repeated key
	resultMissingScope                // refused: require_scope, and the scope is empty
	resultTooLarge                    // refused: the body is over max_request_body
	resultError                       // the store failed (503, or passed through with fail_open)
	resultUnknown                     // refused: the first request's outcome is unknown (on_unknown_outcome keep)
	resultUnreplayable                // refused: the first request ran, and its response cannot be replayed
	resultNotAcceptable               // refused: the stored response is in a coding the retry refuses
	resultUnreadable                  // refused: the stored response does not open (encryption_keys)
	resultGone                        // the client left while its claim waited for the store (nothing ran), or its replay for a decode slot (499)
	resultReplayBusy                  // refused: the stored response needs decoding, and no decode slot came free in time (503)
	numResults
)

// results names every result.
var results = [numResults]struct {
	value string // of the placeholder
	label string // of the metric
}{
	resultNew:           {"new", "new"},
	resultReplay:        {"replay", "replay"},
	resultConflict:      {"conflict", "conflict"},
	resultMismatch:      {"mismatch", "mismatch"},
	resultBypass:        {"bypass", "bypass"},
	resultInvalid:       {"invalid", "invalid"},
	resultMissingScope:  {"missing_scope", "missing_scope"},
	resultTooLarge:      {"too_large", "too_large"},
	resultError:         {"error", "store_error"},
	resultUnknown:       {"unknown", "unknown"},
	resultUnreplayable:  {"unreplayable", "unreplayable"},
	resultNotAcceptable: {"not_acceptable", "not_acceptable"},
	resultUnreadable:    {"unreadable", "unreadable"},
	resultGone:          {"client_gone", "client_gone"},
	resultReplayBusy:    {"replay_busy", "replay_busy"},
}
