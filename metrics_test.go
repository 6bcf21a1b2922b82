package idempotency

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

func count(label string) float64 {
	return testutil.ToFloat64(collectors.requests.WithLabelValues(label))
}

func TestMetricsCountResultsAndStoreOperations(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	if h.metrics == nil {
		t.Fatal("metrics are off by default")
	}
	before := map[string]float64{}
	for _, r := range []string{"new", "replay", "mismatch", "invalid", "bypass", "too_large"} {
		before[r] = count(r)
	}
	acquires := testutil.CollectAndCount(collectors.storeOps)
	b := &backend{}
	do(h, b, post("/m", "k", "x"))
	do(h, b, post("/m", "k", "x"))
	do(h, b, post("/m", "k", "y"))
	do(h, b, post("/m", "a b", "x"))
	do(h, b, post("/m", "", "x"))
	for r, want := range map[string]float64{"new": 1, "replay": 1, "mismatch": 1, "invalid": 1, "bypass": 1, "too_large": 0} {
		if got := count(r) - before[r]; got != want {
			t.Errorf("requests_total{result=%q} grew by %v, want %v", r, got, want)
		}
	}
	if testutil.CollectAndCount(collectors.storeOps) < acquires || testutil.CollectAndCount(collectors.storeOps) == 0 {
		t.Fatal("no store operation latency recorded")
	}
	if n := testutil.ToFloat64(collectors.inFlight); n != 0 {
		t.Fatalf("in_flight_claims = %v after every request ended", n)
	}
}

func TestMetricsInFlightGauge(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	b := &backend{blockers: make(chan struct{})}
	base := testutil.ToFloat64(collectors.inFlight)
	done := make(chan response)
	go func() { done <- do(h, b, post("/m", "held", "x")) }()
	waitFor(t, func() bool { return b.runs.Load() == 1 })
	if got := testutil.ToFloat64(collectors.inFlight) - base; got != 1 {
		t.Fatalf("in_flight_claims rose by %v while a request ran, want 1", got)
	}
	close(b.blockers)
	<-done
	if got := testutil.ToFloat64(collectors.inFlight) - base; got != 0 {
		t.Fatalf("in_flight_claims is %v above its base after the request", got)
	}
}

// A config reload registers the collectors again, into the same or a new
// registry: neither is an error, and counts carry over.
func TestMetricsSurviveReloads(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for range 2 {
		if _, err := newMetrics(reg); err != nil {
			t.Fatalf("registering twice: %v", err)
		}
	}
	if _, err := newMetrics(prometheus.NewPedanticRegistry()); err != nil {
		t.Fatalf("registering into a new registry: %v", err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gathering: %v", err)
	}
}

func TestDisableMetrics(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.DisableMetrics = true })
	if h.metrics != nil {
		t.Fatal("metrics on despite disable_metrics")
	}
	o, ok := h.store.(*observed)
	if !ok {
		t.Fatalf("store %T, want the observed store", h.store)
	}
	if o.latency[opAcquire] != nil {
		t.Fatal("store calls timed despite disable_metrics")
	}
	before := count("new")
	wantStatus(t, do(h, &backend{}, post("/m", "k", "x")), 201)
	if count("new") != before {
		t.Fatal("a handler with disable_metrics counted a request")
	}
}

func TestMetricsCountTakeovers(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.LockTimeout = caddy.Duration(time.Second) })
	req := post("/m", "dead", "x")
	dead := &store.Claim{Token: storetest.NewToken(), Endpoint: fingerprint.Endpoint(fingerprint.DefaultEndpoint, req, nil), CreatedAt: time.Now(), Lease: 50 * time.Millisecond}
	if got, err := h.store.Acquire(context.Background(), store.NewKey("", "dead"), dead); got.Record != nil || err != nil {
		t.Fatalf("dead owner's claim: %v %v", got.Record, err)
	}
	time.Sleep(100 * time.Millisecond)
	before := testutil.ToFloat64(collectors.takeovers)
	wantStatus(t, do(h, &backend{}, req), 201)
	if got := testutil.ToFloat64(collectors.takeovers) - before; got != 1 {
		t.Fatalf("lease_takeovers_total grew by %v, want 1", got)
	}
	wantStatus(t, do(h, &backend{}, post("/m", "fresh", "x")), 201)
	if got := testutil.ToFloat64(collectors.takeovers) - before; got != 1 {
		t.Fatalf("a fresh key counted as a takeover")
	}
}

// The store label is the store's name, as `caddy idempotency stores` lists
// it: the one its config gives it, else its default name.
func TestMetricsLabelStoresByName(t *testing.T) {
	for _, tc := range []struct{ raw, label string }{
		{`{"module":"memory","max_entries":9711,"name":"metrics test"}`, "metrics test"},
		{`{"module":"memory","max_entries":9712}`, "memory"},
	} {
		h := provision(t, json.RawMessage(tc.raw), nil)
		before := observations(t, tc.label, "acquire")
		wantStatus(t, do(h, &backend{}, post("/m", "metrics-"+itoa(testSeq.Add(1)), "x")), 201)
		if got := observations(t, tc.label, "acquire") - before; got != 1 {
			t.Errorf("%s: store_operation_duration_seconds{store=%q,operation=\"acquire\"} grew by %d, want 1", tc.raw, tc.label, got)
		}
	}
}

// observations is the count of the store operation histogram's series for
// the store and operation.
func observations(t *testing.T, storeLabel, operation string) uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collectors.storeOps)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["store"] == storeLabel && labels["operation"] == operation {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}
