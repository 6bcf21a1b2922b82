package idempotency

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// TestDashboardAndRulesInCaddy checks the dashboard's and the alerting
// rules' queries against what a real Caddy exports: the module's metrics,
// with every store in use and every result, store operation and store
// error made to happen, and Caddy's own HTTP metrics (the metrics global
// option). A metric, label or label value that a query names and the Caddy
// does not export fails the test, and so does a metric of the module that
// no panel shows.
func TestDashboardAndRulesInCaddy(t *testing.T) {
	gate := make(chan struct{})
	var openGate sync.Once
	arrived := make(chan string, 4)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch {
		case strings.HasSuffix(r.URL.Path, "/fail"):
			w.WriteHeader(http.StatusInternalServerError)
			return
		case strings.HasSuffix(r.URL.Path, "/slow"):
			arrived <- r.URL.Path
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "created %s", r.URL.Path)
	}))
	defer upstream.Close()
	defer openGate.Do(func() { close(gate) })
	redisSrv := testredis.Start(t)
	dsn := sharedPostgres(t).DSN()

	// One route per store. The memory routes make every result happen:
	// /wait/ lets duplicates wait, the last refuses them with 409.
	// lock_timeout is the shortest allowed, so that a slow request renews
	// its claim within half a second and the retries of a failed Redis
	// call stop within a second.
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9583
	https_port 9546
	grace_period 1ns
	metrics
}
http://localhost:9583 {
	handle /wait/* {
		idempotency {
			store memory
			lock_timeout 1s
			on_conflict wait 10s
		}
		reverse_proxy %[1]s
	}
	handle /file/* {
		idempotency {
			store file {
				name file
				path %[2]q
			}
		}
		reverse_proxy %[1]s
	}
	handle /redis/* {
		idempotency {
			lock_timeout 1s
			store redis {
				name redis
				local_cache 1MiB
				address %[3]s
				dial_timeout 200ms
				read_timeout 200ms
			}
		}
		reverse_proxy %[1]s
	}
	handle /postgres/* {
		idempotency {
			store postgres {
				name postgres
				dsn %[4]q
				table idem_dashboard_%[5]d
			}
		}
		reverse_proxy %[1]s
	}
	handle {
		idempotency {
			store memory
			lock_timeout 1s
			max_request_body 64
		}
		reverse_proxy %[1]s
	}
}`, upstream.Listener.Addr(), t.TempDir(), redisSrv.Addr(), dsn, testSeq.Add(1)), "caddyfile")

	client := &http.Client{Timeout: 20 * time.Second}
	send := func(path, body string, keys ...string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, "http://localhost:9583"+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			req.Header.Add("Idempotency-Key", k)
		}
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	expect := func(want int, path, body string, keys ...string) {
		t.Helper()
		resp, err := send(path, body, keys...)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			t.Fatalf("POST %s with keys %q: %d, want %d", path, keys, resp.StatusCode, want)
		}
	}
	background := func(want int, path, body, key string) chan error {
		done := make(chan error, 1)
		go func() {
			resp, err := send(path, body, key)
			if err == nil && resp.StatusCode != want {
				err = fmt.Errorf("POST %s with key %q: %d, want %d", path, key, resp.StatusCode, want)
			}
			done <- err
		}()
		return done
	}
	awaitUpstream := func(done chan error) {
		t.Helper()
		select {
		case <-arrived:
		case err := <-done:
			t.Fatalf("the slow request ended before it reached the upstream: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the slow request did not reach the upstream")
		}
	}

	before := scrapeFamilies(t)
	stores := []string{"memory", "file", "redis", "postgres"}
	for _, store := range stores {
		prefix := "/" + store
		if store == "memory" {
			prefix = ""
		}
		expect(http.StatusCreated, prefix+"/orders", `{"n":1}`, "a1")             // new
		expect(http.StatusCreated, prefix+"/orders", `{"n":1}`, "a1")             // replay
		expect(http.StatusInternalServerError, prefix+"/fail", `{}`, "f1")        // new, then released
		expect(http.StatusUnprocessableEntity, prefix+"/orders", `{"n":2}`, "a1") // mismatch
	}
	expect(http.StatusCreated, "/orders", `{"n":3}`)                                   // bypass
	expect(http.StatusBadRequest, "/orders", `{"n":4}`, "b1", "b2")                    // invalid
	expect(http.StatusRequestEntityTooLarge, "/orders", strings.Repeat("x", 65), "c1") // too_large
	redisSrv.Kill()
	expect(http.StatusServiceUnavailable, "/redis/orders", `{"n":5}`, "e1") // store_error

	first := background(http.StatusCreated, "/wait/slow", "w", "w1")
	awaitUpstream(first)
	waiter := background(http.StatusCreated, "/wait/slow", "w", "w1")
	slow := background(http.StatusCreated, "/slow", "s", "s1")
	awaitUpstream(slow)
	expect(http.StatusConflict, "/slow", "s", "s1") // conflict

	// Hold the slow requests until the waiter waits and a claim was
	// renewed, so that the gauges and the renewals are seen.
	renewed := func(fams map[string]*dto.MetricFamily) bool {
		return value(fams, "caddy_idempotency_lease_renewals_total") > value(before, "caddy_idempotency_lease_renewals_total")
	}
	deadline := time.Now().Add(10 * time.Second)
	for during := scrapeFamilies(t); ; during = scrapeFamilies(t) {
		if value(during, "caddy_idempotency_waiting_duplicates") >= 1 && renewed(during) {
			if n := value(during, "caddy_idempotency_in_flight_claims"); n < 2 {
				t.Errorf("%v claims in flight while two requests run", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no waiting duplicate and renewal seen in 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	openGate.Do(func() { close(gate) })
	for _, done := range []chan error{first, waiter, slow} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	after := scrapeFamilies(t)
	more := func(name string, labelPairs ...string) bool {
		return value(after, name, labelPairs...) > value(before, name, labelPairs...)
	}
	for _, r := range []string{"new", "replay", "conflict", "mismatch", "bypass", "invalid", "too_large", "store_error"} {
		if !more("caddy_idempotency_requests_total", "result", r) {
			t.Errorf("no request counted as %s", r)
		}
	}
	for _, store := range stores {
		for _, op := range []string{"acquire", "complete", "release"} {
			if !more("caddy_idempotency_store_operation_duration_seconds", "store", store, "operation", op) {
				t.Errorf("no %s %s timed", store, op)
			}
		}
	}
	if !more("caddy_idempotency_store_operation_duration_seconds", "store", "memory", "operation", "renew") {
		t.Error("no renewal timed")
	}
	if !more("caddy_idempotency_store_errors_total", "store", "redis", "operation", "acquire") {
		t.Error("no store error counted")
	}
	// The local cache keeps a subscription from provisioning on: the kill
	// of Redis dropped it.
	if !more("caddy_idempotency_store_subscription_losses_total", "store", "redis") {
		t.Error("no lost subscription counted")
	}
	exp := exposeFamilies(after)

	t.Run("dashboard", func(t *testing.T) {
		dash := loadDashboard(t)
		read := make(map[string]bool)
		for _, q := range dashboardQueries(t, dash) {
			errs := exp.check(q.expr)
			if q.variable {
				errs = exp.checkVariableQuery(q.expr)
			}
			for _, err := range errs {
				t.Errorf("%s: %v\n\t%s", q.where, err, q.expr)
			}
			if refs, err := parsePromQL(q.expr); err == nil {
				for _, s := range refs.selectors {
					read[s.metric] = true
				}
			}
		}
		for family, series := range exp.families {
			if !strings.HasPrefix(family, "caddy_idempotency_") {
				continue
			}
			shown := false
			for _, s := range series {
				shown = shown || read[s]
			}
			if !shown {
				t.Errorf("%s is exported but no panel of %s shows it", family, dashboardPath)
			}
		}
	})
	t.Run("rules", func(t *testing.T) {
		for _, r := range loadRules(t).rules() {
			for _, err := range exp.check(r.Expr) {
				t.Errorf("%s: %v\n\t%s", r.Alert, err, r.Expr)
			}
		}
		// The unit tests' series must be real ones, or they test nothing.
		for _, s := range loadRuleTests(t).series() {
			for _, err := range exp.check(s) {
				t.Errorf("%s: %v", rulesTestPath, err)
			}
		}
	})
}

func scrapeFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value sums a counter's or a gauge's series, or a histogram's counts,
// over the series that have the given label pairs.
func value(fams map[string]*dto.MetricFamily, name string, labelPairs ...string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		has := make(map[string]string)
		for _, p := range m.GetLabel() {
			has[p.GetName()] = p.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labelPairs); i += 2 {
			match = match && has[labelPairs[i]] == labelPairs[i+1]
		}
		if match {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}
