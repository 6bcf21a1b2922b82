package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fileStore is the store block for a database in dir.
func fileStore(dir string) string {
	return fmt.Sprintf(`store file {
	path %q
}`, dir)
}

// The protocol, concurrency and disconnect scenarios with the file store,
// each on its own database.
func TestFileStore(t *testing.T) {
	t.Parallel()

	t.Run("protocol", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, fileStore(dir)))
		durableProtocol(t, u, c)
		if fi, err := os.Stat(filepath.Join(dir, "idempotency.db")); err != nil || fi.Size() == 0 {
			t.Fatalf("the records are not in %s: %v", filepath.Join(dir, "idempotency.db"), err)
		}
	})

	t.Run("concurrent_duplicates", func(t *testing.T) {
		t.Parallel()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, fileStore(t.TempDir())))
		concurrentDuplicates(t, u, []*caddyProc{c}, "api.test")
	})

	t.Run("client_disconnect", func(t *testing.T) {
		t.Parallel()
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, fileStore(t.TempDir())))
		durableClientDisconnect(t, u, c)
	})
}

// The file store keeps its records across the end of the Caddy process:
// a SIGKILL after a completion, a SIGKILL during the upstream call, and a
// graceful stop. The requests carry one Host, so that the restarted Caddy,
// on another port, serves the same endpoint.
func TestFileStoreRestart(t *testing.T) {
	t.Parallel()

	// Caddy is killed once the response is stored: the restarted Caddy
	// replays it, and the upstream never runs again.
	t.Run("killed_after_completion", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		u := startUpstream(t)
		site := proxySite(u, fileStore(dir))
		a := startCaddy(t, "A", site)
		cl := newClient(t)
		const key = "done-1"
		mk := func(c *caddyProc) func() *http.Request {
			return func() *http.Request {
				return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), hdrCookie, "1", "Host", "api.test")
			}
		}
		first := send(t, cl, mk(a)())
		wantStatus(t, "first request", first, http.StatusCreated)
		// Once A replays, the record is committed (and synced) in the file.
		replay, _ := retryUntilSettled(t, cl, mk(a), 10*time.Second)
		wantReplay(t, "retry before the kill", first, replay)

		a.Kill()
		a2 := startCaddy(t, "A restarted", site)
		replay = send(t, cl, mk(a2)())
		wantReplay(t, "retry after the SIGKILL and restart", first, replay)
		wantCount(t, "upstream runs", u.starts(key), 1)

		// The restarted process claims new keys in the same file.
		res := send(t, cl, req(http.MethodPost, a2.URL+"/orders", "new-1", []byte(`{}`), "Host", "api.test"))
		wantStatus(t, "new key after the restart", res, http.StatusCreated)
		wantCount(t, "upstream runs of the new key", u.starts("new-1"), 1)
	})

	// Caddy is killed while the upstream runs. While A lives, retries are
	// refused, past a lease too (A renews). The restarted Caddy still
	// knows A's claim (the claims journal): retries are refused until its
	// lease passes, then one runs the request again, as the README
	// documents for a crash during the upstream call, and the next ones
	// replay it.
	t.Run("killed_mid_request", func(t *testing.T) {
		t.Parallel()
		fileKilledMidRequest(t, false)
	})
	// The same under on_unknown_outcome keep: at most once across the
	// SIGKILL, the takeover is the request's unknown outcome (502 until
	// ttl), and the upstream saw the request once.
	t.Run("killed_mid_request_keep", func(t *testing.T) {
		t.Parallel()
		fileKilledMidRequest(t, true)
	})

	// A graceful stop (SIGTERM, as a deploy does) keeps completed records
	// too.
	t.Run("graceful_restart", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		u := startUpstream(t)
		site := proxySite(u, fileStore(dir))
		a := startCaddy(t, "A", site)
		cl := newClient(t)
		const key = "deploy-1"
		mk := func(c *caddyProc) func() *http.Request {
			return func() *http.Request {
				return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), "Host", "api.test")
			}
		}
		first := send(t, cl, mk(a)())
		wantStatus(t, "first request", first, http.StatusCreated)
		stopGracefully(t, a)
		a2 := startCaddy(t, "A restarted", site)
		replay, _ := retryUntilSettled(t, cl, mk(a2), 10*time.Second)
		wantReplay(t, "retry after the graceful restart", first, replay)
		wantCount(t, "upstream runs", u.starts(key), 1)
	})

	// bbolt locks the file: a second Caddy on the same path starts (it
	// cannot tell itself from caddy validate beside the first), says in its
	// log that another process holds the lock, and answers 503 store
	// unavailable without touching the file, while the first goes on
	// serving. Once the first has stopped, the second opens the file and
	// replays what the first stored.
	t.Run("second_process_waits", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		u := startUpstream(t)
		site := proxySite(u, fileStore(dir))
		a := startCaddy(t, "A", site)
		cl := newClient(t)
		mk := func(c *caddyProc, key string) *http.Request {
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), "Host", "api.test")
		}
		first := send(t, cl, mk(a, "first-1"))
		wantStatus(t, "first request to A", first, http.StatusCreated)

		b := startCaddy(t, "B", site)
		if !strings.Contains(b.Log(), "another process holds the lock of the idempotency database") {
			t.Fatalf("the second Caddy on %s did not say that another process holds the lock", dir)
		}
		wantProblem(t, "a new key to the second Caddy", send(t, cl, mk(b, "second-1")), http.StatusServiceUnavailable, "store-unavailable", true)
		wantStatus(t, "the first Caddy beside the second", send(t, cl, mk(a, "still-1")), http.StatusCreated)
		wantCount(t, "upstream runs of the key sent to the second Caddy", u.starts("second-1"), 0)

		stopGracefully(t, a)
		wantReplay(t, "the first Caddy's key, to the second once the first stopped", first, send(t, cl, mk(b, "first-1")))
		wantStatus(t, "a new key to the second Caddy once the first stopped", send(t, cl, mk(b, "second-1")), http.StatusCreated)
		wantCount(t, "upstream runs of the first key", u.starts("first-1"), 1)
	})
}

// The deploy step "caddy validate, then caddy reload" while Caddy runs on
// the file: validate provisions the new config in a process of its own,
// which cannot have the lock the running Caddy holds and must not need it;
// it still refuses a path no process could use. The reload that follows
// shares the open file, as before.
func TestFileStoreValidateWhileRunning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	u := startUpstream(t)
	a := startCaddy(t, "A", proxySite(u, fileStore(dir)))
	cl := newClient(t)
	mk := func(key string) *http.Request {
		return req(http.MethodPost, a.URL+"/orders", key, []byte(`{"sku":"tea"}`), "Host", "api.test")
	}
	first := send(t, cl, mk("before-reload"))
	wantStatus(t, "first request", first, http.StatusCreated)

	next := proxySite(u, fileStore(dir)+"\nttl 1h") // a change, so that the reload provisions anew
	if out, err := caddyValidate(t, next); err != nil || !strings.Contains(out, "Valid configuration") {
		t.Fatalf("caddy validate of a config on the file the running Caddy holds: %v; output:\n%s", err, out)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := caddyValidate(t, proxySite(u, fileStore(filepath.Join(plain, "sub")))); err == nil || !strings.Contains(out, "creating directory") {
		t.Fatalf("caddy validate of a path under a plain file: %v, want it refused; output:\n%s", err, out)
	}
	a.wantAlive("after caddy validate")

	if err := a.Reload(next); err != nil {
		t.Fatalf("the reload after caddy validate: %v", err)
	}
	wantReplay(t, "retry after the reload", first, send(t, cl, mk("before-reload")))
	wantStatus(t, "new key after the reload", send(t, cl, mk("after-reload")), http.StatusCreated)
	wantCount(t, "upstream runs", u.starts("before-reload"), 1)
}

// caddyValidate runs caddy validate on a Caddyfile with site, as its own
// process, and returns its output.
func caddyValidate(t *testing.T, site string) (string, error) {
	t.Helper()
	cfgDir := t.TempDir()
	cfg := filepath.Join(cfgDir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(makeCaddyfile(freePort(t), freePort(t), site)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBin, "validate", "--config", cfg, "--adapter", "caddyfile")
	cmd.Dir = cfgDir
	cmd.Env = append(os.Environ(), "HOME="+cfgDir, "XDG_DATA_HOME="+filepath.Join(cfgDir, "data"), "XDG_CONFIG_HOME="+filepath.Join(cfgDir, "config"))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("caddy validate still ran after a minute; output:\n%s", out)
	}
	return string(out), err
}

// stopGracefully ends c with SIGTERM, as a deploy does, and fails the test
// if Caddy had to be killed.
func stopGracefully(t *testing.T, c *caddyProc) {
	t.Helper()
	c.killed = true // an exit the test asks for
	start := time.Now()
	c.stop()
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("caddy %s did not stop on SIGTERM: %v", c.name, c.cmd.ProcessState)
	}
	t.Logf("caddy %s stopped gracefully in %v (%v)", c.name, time.Since(start).Round(time.Millisecond), c.cmd.ProcessState)
}

// fileKilledMidRequest kills Caddy while the upstream runs a request on
// the file store, past one renewed lease, and starts it again on the same
// path: the restarted Caddy finds the dead process's renewed claim, so
// retries get 409 while that lease lasts; then one runs the request anew,
// or with keep is answered as its unknown outcome.
func fileKilledMidRequest(t *testing.T, keep bool) {
	const lease = 2 * time.Second
	dir := t.TempDir()
	u := startUpstream(t)
	options := fileStore(dir) + "\nlock_timeout 2s"
	if keep {
		options += "\non_unknown_outcome keep"
	}
	site := proxySite(u, options)
	a := startCaddy(t, "A", site)
	cl := newClient(t)
	const key = "crash-1"
	mk := func(c *caddyProc) func() *http.Request {
		return func() *http.Request {
			// The first run takes 20s (A dies during it); a second is fast.
			return req(http.MethodPost, c.URL+"/payments", key, []byte(`{"amount":99}`), hdrDelay, "20s,0", "Host", "api.test")
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
	// Past one lease, the running request has renewed its claim: the
	// restarted Caddy must find the renewed lease, not the first.
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
	res, sentAt, conflicts := crashedOwnerTakeover(t, u, key, mk(a2), lease, killed, keep)
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
}
