package idempotency

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/admin"
	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/admintest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func approx(t *testing.T, what string, got, want, tolerance time.Duration) {
	t.Helper()
	if got < want-tolerance || got > want+tolerance {
		t.Fatalf("%s = %v, want about %v", what, got, want)
	}
}

func parseDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// The admin API sees the records the handler made, the same way on every
// store: a key's lookup by client key or by hash, its purge, and the
// listing of claims in flight.
func TestAdminOnEveryStore(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h, name := provisionNamed(t, raw, nil)
		srv := admintest.Server(t, admintest.Module(t))
		storeQ := "&store=" + url.QueryEscape(name)
		b := &backend{}

		wantStatus(t, do(h, b, post("/orders", "order-1", `{"sku":"tea"}`)), http.StatusCreated)
		hash := store.NewKey("", "order-1").String()

		var info admin.KeyInfo
		body := admintest.Call(t, srv, "GET", "/idempotency/keys/"+hash+"?"+storeQ[1:], 200, &info)
		if info.Store != name || info.Key != hash || info.State != "completed" || info.Endpoint != "POST api.example.com/orders" ||
			info.Status != 201 || info.BodySize != len(`{"order":42}`) || info.Truncated {
			t.Fatalf("lookup = %+v", info)
		}
		if strings.Contains(body, "order\\\":42") || strings.Contains(body, "X-Order") || strings.Contains(body, "eyJvcmRlciI6NDJ9") {
			t.Fatalf("lookup shows the stored response: %s", body)
		}
		approx(t, "age", parseDuration(t, info.Age), 0, time.Minute)
		approx(t, "expires_in", parseDuration(t, info.ExpiresIn), 24*time.Hour, time.Minute)
		approx(t, "expires_at", time.Until(*info.ExpiresAt), 24*time.Hour, time.Minute)
		approx(t, "created_at", time.Since(info.CreatedAt), 0, time.Minute)

		// Another scope is another key.
		admintest.WantError(t, srv, "GET", "/idempotency/keys/"+store.NewKey("bob", "order-1").String()+"?"+storeQ[1:], 404, "no record for key")

		// A claim in flight: listed as stuck once old enough, purged.
		b.blockers = make(chan struct{})
		done := make(chan response, 1)
		go func() { done <- do(h, b, post("/slow", "slow-1", "")) }()
		waitFor(t, func() bool { return b.runs.Load() == 2 })
		slow := store.NewKey("", "slow-1").String()
		info = admin.KeyInfo{}
		admintest.Call(t, srv, "GET", "/idempotency/keys/"+slow+"?"+storeQ[1:], 200, &info)
		if info.State != "in_progress" || info.Endpoint != "POST api.example.com/slow" || info.Status != 0 || info.BodySize != 0 {
			t.Fatalf("lookup of a claim = %+v", info)
		}
		approx(t, "lease", parseDuration(t, info.ExpiresIn), 30*time.Second, 10*time.Second)

		var stuck admin.StuckList
		admintest.Call(t, srv, "GET", "/idempotency/stuck?older_than=0s"+storeQ, 200, &stuck)
		if stuck.Store != name || stuck.OlderThan != "0s" || stuck.Limit != 100 ||
			len(stuck.Claims) != 1 || stuck.Claims[0].Key != slow || stuck.Claims[0].Endpoint != "POST api.example.com/slow" ||
			stuck.Claims[0].State != "in_progress" || stuck.Claims[0].ExpiresAt == nil {
			t.Fatalf("stuck = %+v, want the one claim", stuck)
		}
		stuck = admin.StuckList{}
		body = admintest.Call(t, srv, "GET", "/idempotency/stuck?older_than=1h&limit=5"+storeQ, 200, &stuck)
		if len(stuck.Claims) != 0 || stuck.OlderThan != "1h0m0s" || stuck.Limit != 5 || !strings.Contains(body, `"claims":[]`) {
			t.Fatalf("stuck?older_than=1h = %s, want no claims", body)
		}

		var p admin.Purged
		admintest.Call(t, srv, "DELETE", "/idempotency/keys/"+slow+"?"+storeQ[1:], 200, &p)
		if p != (admin.Purged{Store: name, Key: slow, Deleted: true}) {
			t.Fatalf("purge = %+v", p)
		}
		// The purged owner finishes: its client gets the answer, but the
		// store keeps nothing, and a retry runs anew.
		close(b.blockers)
		wantStatus(t, <-done, http.StatusCreated)
		admintest.WantError(t, srv, "GET", "/idempotency/keys/"+slow+"?"+storeQ[1:], 404, "no record for key "+slow)

		// Purging the completed record: the next request with its key runs.
		admintest.Call(t, srv, "DELETE", "/idempotency/keys/"+hash+"?"+storeQ[1:], 200, &p)
		admintest.WantError(t, srv, "DELETE", "/idempotency/keys/"+hash+"?"+storeQ[1:], 404, "no record for key "+hash)
		admintest.WantError(t, srv, "GET", "/idempotency/keys/"+hash+"?"+storeQ[1:], 404, "no record")
		runs := b.runs.Load()
		wantStatus(t, do(h, b, post("/orders", "order-1", `{"sku":"tea"}`)), http.StatusCreated)
		if b.runs.Load() != runs+1 {
			t.Fatal("the request with a admin.Purged key did not run again")
		}
	})
}

// A request whose outcome is unknown holds its key: the operator sees it,
// checks the backend, and purges the key so that the client's retry runs.
func TestAdminOutcomeUnknown(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h, name := provisionNamed(t, raw, func(h *Handler) { h.OnUnknownOutcome = app.UnknownKeep })
		srv := admintest.Server(t, admintest.Module(t))
		storeQ := "?store=" + url.QueryEscape(name)
		var broken atomic.Bool
		broken.Store(true)
		o := startOrigin(t, func(w http.ResponseWriter, r *http.Request) {
			if broken.Load() {
				hangUp(w, r)
				return
			}
			created(w, r)
		})
		next := reverseProxy(t, "", o.addr())
		wantHandlerError(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusBadGateway)
		hash := store.NewKey("", "pay-1").String()

		var info admin.KeyInfo
		body := admintest.Call(t, srv, "GET", "/idempotency/keys/"+hash+storeQ, 200, &info)
		if info.State != "completed" || !info.OutcomeUnknown || info.Truncated || info.Status != 0 || info.BodySize != 0 ||
			info.Endpoint != "POST api.example.com/pay" || !strings.Contains(body, `"outcome_unknown":true`) {
			t.Fatalf("lookup of an unknown outcome = %s", body)
		}
		approx(t, "expires_in", parseDuration(t, info.ExpiresIn), 24*time.Hour, time.Minute)
		wantProblem(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusBadGateway, unknownTitle)

		var p admin.Purged
		admintest.Call(t, srv, "DELETE", "/idempotency/keys/"+hash+storeQ, 200, &p)
		if !p.Deleted {
			t.Fatalf("purge = %+v", p)
		}
		broken.Store(false)
		wantStatus(t, serve(h, next, post("/pay", "pay-1", "x"), nil), http.StatusCreated)
		if n := o.runs.Load(); n != 2 {
			t.Fatalf("upstream got %d requests, want 2: the first, and the retry after the purge", n)
		}
	})
}

// A store that cannot be reached answers 503, as the handler does.
func TestAdminStoreUnavailable(t *testing.T) {
	redisSrv := testredis.Start(t)
	_, name := provisionNamed(t, json.RawMessage(`{"module":"redis","addresses":["`+redisSrv.Addr()+`"],"dial_timeout":"200ms","read_timeout":"200ms"}`), nil)
	srv := admintest.Server(t, admintest.Module(t))
	redisSrv.Kill()
	q := "store=" + url.QueryEscape(name)
	k := "/idempotency/keys/" + store.NewKey("", "k").String() + "?"
	admintest.WantError(t, srv, "GET", k+q, 503, "idempotency store unavailable")
	admintest.WantError(t, srv, "DELETE", k+q, 503, "deleting in store "+name)
	admintest.WantError(t, srv, "GET", "/idempotency/stuck?"+q, 503, "listing claims in store "+name)
}
