package e2e

import (
	"net/http"
	"testing"
	"time"
)

// A config reload ('caddy reload') must not forget keys: a completed key
// still replays, and a request in flight across the reload keeps its claim
// and stores its response, even when the old configuration's grace period
// cuts its client off.
func TestReloadKeepsKeys(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		site := proxySite(u, storeOptions+"\nlock_timeout 1500ms")
		c := startCaddy(t, "caddy", site)
		cl := newClient()
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
		go func() {
			res, err := do(newClient(), mk("inflight-1", hdrGate, "1")())
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
		fresh := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: 10 * time.Second}
		var r response
		if !eventually(10*time.Second, 20*time.Millisecond, func() bool {
			r = send(t, fresh, mk("done-1")())
			return r.Header.Get("X-Config") == "v2"
		}) {
			t.Fatalf("the new configuration never answered: %s", r)
		}
		wantReplay(t, "completed key after the reload", done, r)
		wantProblem(t, "in-flight key after the reload", send(t, fresh, mk("inflight-1")()), http.StatusConflict, "outstanding", true)

		// The old configuration is cleaned up once its grace period (1s)
		// is over, while its request still runs and renews its claim
		// (every 500ms).
		time.Sleep(time.Until(reloadStart.Add(2 * time.Second)))
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
