package e2e

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

// A config reload ('caddy reload') must not forget keys: a completed key
// still replays, and a request in flight across the reload, running past
// the old configuration's grace period, keeps renewing its claim and
// stores its response for the retry.
//
// Caddy cleans up the old configuration's modules as soon as a reload
// starts, without waiting for its requests, so a store must keep working
// for the requests that outlive its Cleanup.
func TestReloadKeepsKeys(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		site := proxySite(u, storeOptions+"\nlock_timeout 1500ms")
		c := startCaddy(t, "caddy", site)
		cl := newClient(t)
		mk := func(key string, hdr ...string) func() *http.Request {
			return func() *http.Request {
				return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), hdr...)
			}
		}
		done := send(t, cl, mk("done-1")())
		wantStatus(t, "request before the reload", done, http.StatusCreated)

		type answer struct {
			res response
			err error
		}
		inflight := make(chan answer, 1)
		inflightClient := newClient(t)
		go func() {
			res, err := do(inflightClient, mk("inflight-1", hdrGate, "1")())
			inflight <- answer{res, err}
		}()
		select {
		case <-u.startedCh("inflight-1"):
		case <-time.After(10 * time.Second):
			t.Fatal("the in-flight request did not reach the upstream")
		}

		// The new configuration marks its answers.
		reloadStart := time.Now()
		if err := c.Reload(site + "\nheader X-Config v2"); err != nil {
			t.Fatal(err)
		}
		fresh := freshClient(t)
		var r response
		if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
			// a connection the old server accepted as it shut down may
			// close unanswered: try again
			var err error
			r, err = do(fresh, mk("done-1")())
			return err == nil && r.Header.Get("X-Config") == "v2"
		}) {
			t.Fatalf("the new configuration never answered: %s", r)
		}
		wantReplay(t, "completed key after the reload", done, r)
		wantProblem(t, "in-flight key after the reload", send(t, fresh, mk("inflight-1")()), http.StatusConflict, "outstanding", true)

		// The old configuration is cleaned up once its grace period (1s)
		// is over, while its request still runs and renews its claim
		// (every 500ms).
		time.Sleep(time.Until(reloadStart.Add(2 * time.Second)))
		c.wantAlive("while a request that spans a reload renews its claim")
		wantProblem(t, "in-flight key after the grace period", send(t, fresh, mk("inflight-1")()), http.StatusConflict, "outstanding", true)
		u.openGate()
		select {
		case a := <-inflight:
			if a.err != nil {
				t.Fatalf("in-flight client: %v", a.err)
			}
			wantStatus(t, "in-flight client", a.res, http.StatusCreated)
		case <-time.After(5 * time.Second):
			t.Fatal("the in-flight client got no answer")
		}
		if !eventually(5*time.Second, 10*time.Millisecond, func() bool { return u.completions("inflight-1") > 0 }) {
			t.Fatalf("the upstream did not complete the in-flight request (cancelled %d)", u.cancelled("inflight-1"))
		}
		retry, _ := retryUntilSettled(t, fresh, mk("inflight-1"), 5*time.Second)
		wantStatus(t, "retry of the in-flight key", retry, http.StatusCreated)
		if !retry.replayed() || string(retry.Body) != string(u.sentBody("inflight-1", 1)) {
			t.Fatalf("retry of the in-flight key did not replay the upstream's answer %q: %s", u.sentBody("inflight-1", 1), retry)
		}
		wantCount(t, "upstream runs of the in-flight key", u.starts("inflight-1"), 1)
		wantCount(t, "upstream runs of the completed key", u.starts("done-1"), 1)
	})
}

// The short form of the reload bug: a request that never renews its claim
// finishes after the reload and cannot store its response.
func TestReloadDuringShortRequest(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		site := proxySite(u, storeOptions)
		c := startCaddy(t, "caddy", site)
		mk := func() *http.Request {
			return req(http.MethodPost, c.URL+"/orders", "short-1", []byte(`{"sku":"tea"}`), hdrGate, "1")
		}
		type answer struct {
			res response
			err error
		}
		inflight := make(chan answer, 1)
		inflightClient := newClient(t)
		go func() {
			res, err := do(inflightClient, mk())
			inflight <- answer{res, err}
		}()
		select {
		case <-u.startedCh("short-1"):
		case <-time.After(10 * time.Second):
			t.Fatal("the request did not reach the upstream")
		}
		if err := c.Reload(site + "\nheader X-Config v2"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		u.openGate()
		a := <-inflight
		c.wantAlive("after a request that spans a reload completed")
		if a.err != nil {
			t.Errorf("the client of the request that spanned the reload got no answer: %v", a.err)
		} else {
			wantStatus(t, "request that spanned the reload", a.res, http.StatusCreated)
		}
		fresh := freshClient(t)
		retry, _ := retryUntilSettled(t, fresh, mk, 3*time.Second)
		wantStatus(t, "retry after the reload", retry, http.StatusCreated)
		if !retry.replayed() || !bytes.Equal(retry.Body, u.sentBody("short-1", 1)) {
			t.Fatalf("retry after the reload did not replay the upstream's answer %q: %s", u.sentBody("short-1", 1), retry)
		}
		wantCount(t, "upstream runs", u.starts("short-1"), 1)
	})
}
