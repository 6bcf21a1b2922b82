package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The protocol options as an API team configures them, through the built
// Caddy and reverse_proxy: the key in the JSON body (Square's style), only
// the payment's own fields fingerprinted, the team's own error docs, the
// record's expiry told, first answers marked, short keys refused.
func TestProtocolOptions(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "protocol", proxySite(u, `key_from json /idempotency_key
fingerprint json
fingerprint_only /amount /currency
problem_base https://docs.example.com/api/idempotency
expiry_header Idempotency-Expires
replay_header Idempotent-Replayed always
min_key_length 8
ttl 1h`))
	cl := newClient(t)
	// The upstream counts runs by the Idempotency-Key header, which the
	// handler does not read here: the key is in the body.
	pay := func(tag, body string) *http.Request {
		return req(http.MethodPost, c.URL+"/payments", tag, []byte(body))
	}
	first := send(t, cl, pay("p1", `{"idempotency_key":"sq-00001","amount":100,"currency":"EUR","sent_at":1}`))
	wantStatus(t, "first payment", first, http.StatusCreated)
	if first.Header.Get("Idempotent-Replayed") != "false" {
		t.Fatalf("first answer: Idempotent-Replayed %q, want false", first.Header.Get("Idempotent-Replayed"))
	}
	exp, err := http.ParseTime(first.Header.Get("Idempotency-Expires"))
	if err != nil || time.Until(exp) < 59*time.Minute || time.Until(exp) > time.Hour {
		t.Fatalf("first answer: Idempotency-Expires %q (%v), want in an hour", first.Header.Get("Idempotency-Expires"), err)
	}
	time.Sleep(1100 * time.Millisecond)
	// Another sent_at, another member order: the same payment.
	replay, _ := retryUntilSettled(t, cl, func() *http.Request {
		return pay("p1", `{"currency":"EUR","sent_at":2,"amount":100,"idempotency_key":"sq-00001"}`)
	}, 10*time.Second)
	if !replay.replayed() || replay.Header.Get("Idempotency-Expires") != first.Header.Get("Idempotency-Expires") {
		t.Fatalf("retry: %s; want a replay with the record's own expiry %s", replay, first.Header.Get("Idempotency-Expires"))
	}
	wantCount(t, "upstream runs of the payment", u.starts("p1"), 1)

	// Another amount: the key is reused, and the problem points at the
	// team's docs.
	reused := send(t, cl, pay("p1", `{"idempotency_key":"sq-00001","amount":200,"currency":"EUR"}`))
	wantProblem(t, "same key, other amount", reused, http.StatusUnprocessableEntity, "key-reused", false)
	if !strings.Contains(string(reused.Body), `"type":"https://docs.example.com/api/idempotency#key-reused"`) ||
		reused.Header.Get("Content-Language") != "en" {
		t.Fatalf("the problem %s does not point at the team's docs in English", reused)
	}
	short := send(t, cl, pay("p2", `{"idempotency_key":"sq-1","amount":1}`))
	wantProblem(t, "a key shorter than min_key_length", short, http.StatusBadRequest, "invalid-key", false)
	wantCount(t, "upstream runs of the short key", u.starts("p2"), 0)
}
