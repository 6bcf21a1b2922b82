package e2e

import (
	"net/http"
	"testing"
	"time"
)

// At most once across a SIGKILL with the file store: Caddy is killed while
// the upstream runs a request, under on_unknown_outcome keep. The Caddy
// started again on the same path finds the dead process's claim, renewed
// past its first lease: retries get 409 while that lease lasts, then the
// one that takes the claim over is the request's unknown outcome (502
// until ttl), and the upstream saw the request once.
func TestFileStoreClaimSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	dir := t.TempDir()
	u := startUpstream(t)
	site := proxySite(u, fileStore(dir)+"\nlock_timeout 4s\non_unknown_outcome keep")
	a := startCaddy(t, "A", site)
	cl := newClient(t)
	const key = "crash-keep-1"
	mk := func(c *caddyProc) func() *http.Request {
		return func() *http.Request {
			// The first run takes 30s: A dies during it. A second run
			// would answer at once, and must never come.
			return req(http.MethodPost, c.URL+"/payments", key, []byte(`{"amount":99}`), hdrDelay, "30s,0", "Host", "api.test")
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := do(cl, mk(a)())
		errc <- err
	}()
	select {
	case <-u.startedCh(key):
	case <-time.After(15 * time.Second):
		t.Fatal("the request to A did not reach the upstream")
	}
	// Past one lease, A has renewed its claim: the restarted Caddy must
	// find the renewed lease, not the first.
	time.Sleep(lease + 500*time.Millisecond)
	wantProblem(t, "retry while A runs the request, past one lease", send(t, cl, mk(a)()), http.StatusConflict, "outstanding", true)

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
	a2 := startCaddy(t, "A restarted", site)
	ready := time.Now()
	res, sentAt, conflicts := crashedOwnerTakeover(t, u, key, mk(a2), lease, killed, true)
	// The renewed claim ends at least two thirds of a lease after the
	// kill: a restart well within that finds it in progress.
	if ready.Sub(killed) < lease/2 && conflicts == 0 {
		t.Fatalf("the restarted Caddy, ready %v after the kill, took the claim over at once: %s", ready.Sub(killed).Round(time.Millisecond), res)
	}
	t.Logf("file store: restart took %v; %d x 409, then the takeover %v after the kill (lock_timeout %v)",
		ready.Sub(killed).Round(time.Millisecond), conflicts, sentAt.Sub(killed).Round(time.Millisecond), lease)
	if !eventually(10*time.Second, 10*time.Millisecond, func() bool { return u.cancelled(key) == 1 }) {
		t.Errorf("the run cut by the kill was not cancelled at the upstream (cancelled %d, completed %d)", u.cancelled(key), u.completions(key))
	}
	wantCount(t, "upstream starts", u.starts(key), 1)
}
