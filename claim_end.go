package idempotency

import (
	"net/http"
	"slices"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// The end of a claimed request: what became of it, decided in one place
// (decideClaimEnd) from what the recorder saw, and carried out by the
// attempt's finish (attempt.go). The table "What a failed upstream leaves
// behind" in docs/guarantees.md is this function in prose; claim_end_test.go
// has a row for each of its rows.

// claimEnd is what a claim becomes once its request is done.
type claimEnd uint8

const (
	endStore          claimEnd = iota // the answer is stored and replayed
	endStoreTruncated                 // it ran, but there is no whole answer: never run again, never replayed
	endRelease                        // nothing was done, or a retry may do it: the retry runs
	endKeepUnknown                    // it may have run and no answer came: kept until ttl as unknown
)

// statusClientClosed is the status Caddy's reverse_proxy writes when the
// request's context ends before the upstream answers: here, when the work
// was cancelled one lease after its client left.
const statusClientClosed = 499

// responseFacts is what the handler knows once the request is done.
type responseFacts struct {
	wroteHeader bool
	status      int  // the final status written, if wroteHeader
	overflow    bool // the body outgrew max_response_body
	handlerErr  bool // the next handler returned an error
	aborted     bool // the next handler panicked
	reached     bool // an upstream may have received the request (reachedUpstream)
}

// decideClaimEnd is the failure table: it reads only the facts and the
// options, and says why, for the logs.
func (h *Handler) decideClaimEnd(s responseFacts) (claimEnd, string) {
	unknown := endRelease
	if h.OnUnknownOutcome == app.UnknownKeep {
		unknown = endKeepUnknown
	}
	switch {
	case !s.wroteHeader && !s.handlerErr && !s.aborted:
		return endStore, "" // the server answers an empty 200
	case !s.wroteHeader && s.reached:
		return unknown, "no answer came from the upstream"
	case !s.wroteHeader:
		return endRelease, "handler failed before responding"
	case s.status == http.StatusSwitchingProtocols:
		// What follows is another protocol on the same connection, which
		// this handler does not see: there is no answer to replay.
		return endRelease, "switched protocols"
	case s.status == statusClientClosed:
		return unknown, "the work was cancelled before the upstream answered"
	case s.status >= 500 && !h.StoreServerErrors:
		return endRelease, "server error" // may be transient: the retry runs again
	case slices.Contains(h.ReleaseStatuses, s.status):
		return endRelease, "the answer says the request was not carried out"
	case s.aborted || s.overflow || s.handlerErr:
		// The upstream answered, so it did the work; its answer broke
		// off, or is too large to keep.
		return endStoreTruncated, ""
	}
	return endStore, ""
}
