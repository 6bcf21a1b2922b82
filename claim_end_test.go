package idempotency

import (
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// TestDecideClaimEnd has one row for each row of the table "What a failed
// upstream leaves behind" in docs/guarantees.md, then the answers that end a claim
// otherwise, each with the default options and with the option that
// changes it.
func TestDecideClaimEnd(t *testing.T) {
	defaults := &Handler{}
	defaults.SetDefaults()
	keep := &Handler{Options: app.Options{OnUnknownOutcome: app.UnknownKeep}}
	keep.SetDefaults()
	storeErrors := &Handler{Options: app.Options{StoreServerErrors: true}}
	storeErrors.SetDefaults()
	only409 := &Handler{Options: app.Options{ReleaseStatuses: []int{409}}}
	only409.SetDefaults()

	answered := func(status int) responseFacts { return responseFacts{wroteHeader: true, status: status} }
	for _, tc := range []struct {
		row   string
		facts responseFacts
		h     *Handler
		want  claimEnd
	}{
		// docs/guarantees.md's failure table.
		{"never reached: connection refused, no upstream", responseFacts{handlerErr: true}, defaults, endRelease},
		{"never reached, with keep", responseFacts{handlerErr: true}, keep, endRelease},
		{"connection reset after the request was sent", responseFacts{handlerErr: true, reached: true}, defaults, endRelease},
		{"connection reset, with keep", responseFacts{handlerErr: true, reached: true}, keep, endKeepUnknown},
		{"response_header_timeout", responseFacts{handlerErr: true, reached: true}, defaults, endRelease},
		{"response_header_timeout, with keep", responseFacts{handlerErr: true, reached: true}, keep, endKeepUnknown},
		{"upstream answered 500", answered(500), defaults, endRelease},
		{"upstream answered 503, store_server_errors", answered(503), storeErrors, endStore},
		{"work cancelled after the client left (499)", answered(statusClientClosed), defaults, endRelease},
		{"work cancelled after the client left, with keep", answered(statusClientClosed), keep, endKeepUnknown},
		{"upstream broke off mid-body", responseFacts{wroteHeader: true, status: 200, aborted: true}, defaults, endStoreTruncated},
		{"upstream broke off mid-body, with keep", responseFacts{wroteHeader: true, status: 200, aborted: true}, keep, endStoreTruncated},
		{"upstream broke off mid-body of a 5xx", responseFacts{wroteHeader: true, status: 502, aborted: true}, defaults, endRelease},

		// Statuses that say the request was not carried out.
		{"429 rate limited", answered(429), defaults, endRelease},
		{"401 expired token", answered(401), defaults, endRelease},
		{"407, 408, 425", answered(425), defaults, endRelease},
		{"429 left out of release_statuses", answered(429), only409, endStore},
		{"409 in release_statuses", answered(409), only409, endRelease},
		{"429 with store_server_errors", answered(429), storeErrors, endRelease},

		// Answers that are not whole.
		{"handler failed after the headers", responseFacts{wroteHeader: true, status: 201, handlerErr: true}, defaults, endStoreTruncated},
		{"handler failed after the headers of a 429", responseFacts{wroteHeader: true, status: 429, handlerErr: true}, defaults, endRelease},
		{"larger than max_response_body", responseFacts{wroteHeader: true, status: 200, overflow: true}, defaults, endStoreTruncated},
		{"101 switching protocols", answered(101), defaults, endRelease},
		{"101 switching protocols, with keep", answered(101), keep, endRelease},

		// Whole answers.
		{"201", answered(201), defaults, endStore},
		{"404", answered(404), defaults, endStore},
		{"nothing written: an empty 200", responseFacts{}, defaults, endStore},
		{"panic before the headers", responseFacts{aborted: true}, defaults, endRelease},
		{"panic before the headers after reaching the upstream, with keep", responseFacts{aborted: true, reached: true}, keep, endKeepUnknown},
	} {
		if got, why := tc.h.decideClaimEnd(tc.facts); got != tc.want {
			t.Errorf("%s: %v (%s), want %v", tc.row, got, why, tc.want)
		}
	}
}
