package e2e

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// Scenarios that every durable store (postgres, file) runs end to end,
// each against its own upstream and Caddy.

// blobSize is the size of the binary answer of durableProtocol: every byte
// value, several times over, well under the default max_response_body.
const blobSize = 300 << 10

// durableProtocol checks the basic protocol through c: a completed key is
// replayed byte for byte (a JSON answer with a cookie, and a binary one),
// and the key used with another body or another path is refused with 422
// without reaching the upstream. It returns the first JSON answer.
func durableProtocol(t *testing.T, u *upstream, c *caddyProc) response {
	t.Helper()
	cl := newClient(t)
	body := []byte(`{"sku":"tea","qty":1}`)
	post := func(key, path string, body []byte, hdr ...string) func() *http.Request {
		return func() *http.Request {
			return req(http.MethodPost, c.URL+path, key, body, append([]string{hdrCookie, "1"}, hdr...)...)
		}
	}

	first := send(t, cl, post("order-1", "/orders", body)())
	wantStatus(t, "first request", first, http.StatusCreated)
	if first.replayed() {
		t.Fatalf("first request marked as replayed: %s", first)
	}
	if !bytes.Equal(first.Body, u.sentBody("order-1", 1)) {
		t.Fatalf("first answer %q differs from what the upstream sent %q", first.Body, u.sentBody("order-1", 1))
	}
	replay, conflicts := retryUntilSettled(t, cl, post("order-1", "/orders", body), 10*time.Second)
	if conflicts > 0 {
		t.Logf("the retry sent right after the first answer got %d x 409 before the replay", conflicts)
	}
	wantReplay(t, "retry", first, replay)
	if replay.Header.Get("Content-Length") != strconv.Itoa(len(first.Body)) {
		t.Fatalf("replay Content-Length %q, body %d bytes", replay.Header.Get("Content-Length"), len(first.Body))
	}
	wantCount(t, "upstream runs after the retry", u.starts("order-1"), 1)

	other := send(t, cl, post("order-1", "/orders", []byte(`{"sku":"coffee","qty":1}`))())
	wantProblem(t, "same key, other body", other, http.StatusUnprocessableEntity, "key-reused", false)
	other = send(t, cl, post("order-1", "/refunds", body)())
	wantProblem(t, "same key, other path", other, http.StatusUnprocessableEntity, "key-reused", false)
	wantCount(t, "upstream runs after the mismatches", u.starts("order-1"), 1)
	wantReplay(t, "retry after the mismatches", first, send(t, cl, post("order-1", "/orders", body)()))

	// A binary answer holding every byte value comes back intact.
	blob := post("blob-1", "/exports", []byte(`{}`), hdrSize, strconv.Itoa(blobSize))
	b1 := send(t, cl, blob())
	wantStatus(t, "binary answer", b1, http.StatusCreated)
	if !bytes.Equal(b1.Body, pattern(blobSize)) {
		t.Fatalf("binary answer: got %d bytes that differ from the upstream's %d", len(b1.Body), blobSize)
	}
	b2, _ := retryUntilSettled(t, cl, blob, 10*time.Second)
	wantReplay(t, "retry of the binary answer", b1, b2)
	wantCount(t, "upstream runs of the binary answer", u.starts("blob-1"), 1)
	return first
}

// durableClientDisconnect: the client gives up while the upstream works,
// the upstream finishes anyway, and the retry gets the response the client
// missed.
func durableClientDisconnect(t *testing.T, u *upstream, c *caddyProc) {
	t.Helper()
	cl := newClient(t)
	const key = "pay-1"
	body := []byte(`{"amount":4200}`)
	mk := func() *http.Request {
		return req(http.MethodPost, c.URL+"/payments", key, body, hdrDelay, "1s")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	begin := time.Now()
	go func() {
		_, err := do(cl, mk().WithContext(ctx))
		errc <- err
	}()
	select {
	case <-u.startedCh(key):
	case <-time.After(15 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	time.Sleep(200*time.Millisecond - time.Since(begin))
	cancel() // the client gives up: its connection closes
	if err := <-errc; err == nil {
		t.Fatal("the request completed before the client disconnected")
	}
	disconnected := time.Now()

	if !eventually(10*time.Second, 10*time.Millisecond, func() bool {
		return u.completions(key)+u.cancelled(key) > 0
	}) {
		t.Fatal("the upstream never finished")
	}
	wantCount(t, "upstream requests whose context was cancelled", u.cancelled(key), 0)
	wantCount(t, "upstream completions", u.completions(key), 1)
	t.Logf("client left after %v; upstream completed %v later", disconnected.Sub(begin).Round(time.Millisecond),
		time.Since(disconnected).Round(time.Millisecond))

	retry, conflicts := retryUntilSettled(t, cl, mk, 10*time.Second)
	wantStatus(t, "retry", retry, http.StatusCreated)
	if !retry.replayed() {
		t.Fatalf("retry was not a replay: %s", retry)
	}
	if want := u.sentBody(key, 1); !bytes.Equal(retry.Body, want) {
		t.Fatalf("replayed body %q, the upstream sent %q", retry.Body, want)
	}
	if retry.Header.Get("Content-Type") != "application/json" || retry.Header.Get(hdrRun) != "1" {
		t.Fatalf("replayed headers lost: %v", retry.Header)
	}
	wantCount(t, "upstream runs", u.starts(key), 1)
	t.Logf("retry replayed after %d x 409", conflicts)
}

// crashedOwnerTakeover is what follows the SIGKILL, at killed, of the Caddy
// that ran the request made by mk under a lease of lease: the retries that
// mk sends (to a surviving or restarted instance, ready at ready) are
// refused with 409 until the dead claim's lease passes, then exactly one
// runs the request anew. It returns the answer that took over and when its
// request was sent.
func crashedOwnerTakeover(t *testing.T, u *upstream, key string, mk func() *http.Request, lease time.Duration, killed time.Time, keep bool) (response, time.Time, int) {
	t.Helper()
	cl := newClient(t)
	var res response
	var sentAt time.Time
	conflicts := 0
	// The claim was renewed at most lease/3 before the kill (more slack
	// under load), so it ends at most one lease after the kill.
	deadline := killed.Add(lease + 10*time.Second)
	for {
		sentAt = time.Now()
		res = send(t, cl, mk())
		if res.Status != http.StatusConflict {
			break
		}
		wantProblem(t, "retry before the lease passed", res, http.StatusConflict, "outstanding", true)
		conflicts++
		if time.Now().After(deadline) {
			t.Fatalf("retries still refused %v after the owner was killed (%d x 409)", time.Since(killed), conflicts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := sentAt.Sub(killed)
	if took < lease/3 {
		t.Fatalf("the retry took over %v after the kill, within the dead owner's %v lease (%d x 409 before)", took, lease, conflicts)
	}
	if keep {
		// At most once: the takeover is the dead owner's unknown outcome,
		// and stays so for its retries.
		wantProblem(t, "retry after the lease passed, on_unknown_outcome keep", res, http.StatusBadGateway, "outcome-unknown", false)
		again := send(t, cl, mk())
		wantProblem(t, "the next retry, on_unknown_outcome keep", again, http.StatusBadGateway, "outcome-unknown", false)
		wantCount(t, "upstream starts (the crashed run only)", u.starts(key), 1)
		return res, sentAt, conflicts
	}
	wantStatus(t, "retry after the lease passed", res, http.StatusCreated)
	if res.replayed() || res.Header.Get(hdrRun) != "2" {
		t.Fatalf("the takeover did not run the request anew: %s", res)
	}
	wantCount(t, "upstream starts (the crashed run and the takeover)", u.starts(key), 2)
	replay, _ := retryUntilSettled(t, cl, mk, 10*time.Second)
	wantReplay(t, "retry after the takeover", res, replay)
	wantCount(t, "upstream starts after the replay", u.starts(key), 2)
	return res, sentAt, conflicts
}

// ownerKilledTakeover runs the crash story on two Caddys sharing the store
// that storeOptions configures: A owns a claim while the upstream runs,
// keeps it past one lease by renewing, and is SIGKILLed; B refuses retries
// until the lease passes, then runs the request again (the documented
// price of a crash during the upstream call), then replays. The takeover
// must come within slack after the lease. With keep (on_unknown_outcome
// keep), the takeover is answered as an unknown outcome instead, and the
// request never runs again. It returns the time from the kill to the
// takeover.
func ownerKilledTakeover(t *testing.T, storeOptions string, slack time.Duration, keep bool) time.Duration {
	t.Helper()
	const lease = 2 * time.Second
	u := startUpstream(t)
	if keep {
		storeOptions += "\non_unknown_outcome keep"
	}
	site := proxySite(u, storeOptions+"\nlock_timeout 2s")
	a := startCaddy(t, "A", site)
	b := startCaddy(t, "B", site)
	cl := newClient(t)
	const key = "crash-1"
	body := []byte(`{"amount":99}`)
	mk := func(c *caddyProc) *http.Request {
		// The first run takes 20s (A dies during it); the takeover is fast.
		return req(http.MethodPost, c.URL+"/payments", key, body, hdrDelay, "20s,0", "Host", "api.test")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := do(cl, mk(a))
		errc <- err
	}()
	select {
	case <-u.startedCh(key):
	case <-time.After(15 * time.Second):
		t.Fatal("the request to A did not reach the upstream")
	}
	// A renews its claim while the upstream runs: past one lease, B must
	// still refuse.
	time.Sleep(lease + 500*time.Millisecond)
	wantProblem(t, "B while A runs the request, past one lease", send(t, cl, mk(b)), http.StatusConflict, "outstanding", true)
	wantCount(t, "upstream starts while A runs", u.starts(key), 1)

	a.Kill()
	killed := time.Now()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("A's client got an answer although A was killed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's client did not notice that A died")
	}
	_, sentAt, conflicts := crashedOwnerTakeover(t, u, key, func() *http.Request { return mk(b) }, lease, killed, keep)
	took := sentAt.Sub(killed)
	t.Logf("kill-to-takeover: %v (lock_timeout %v; %d x 409 from B after the kill)", took.Round(time.Millisecond), lease, conflicts)
	// The lease ends at most one lease after A's last renewal, which came
	// before the kill; the slack covers a loaded machine.
	if took > lease+slack {
		t.Fatalf("takeover took %v: far more than the %v lease after the last renewal", took, lease)
	}
	b.wantAlive("after the takeover")
	return took
}
