package idempotency

import (
	"errors"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// The collectors are process-wide, so counters survive reloads, which
// register them again (tolerated below). Labels never hold a key or a path.
var collectors struct {
	once       sync.Once
	requests   *prometheus.CounterVec
	storeOps   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	renewals   prometheus.Counter
	takeovers  prometheus.Counter
	waiting    prometheus.Gauge
	storeErrs  *prometheus.CounterVec
	unreadable *prometheus.CounterVec
	// retriesSkipped counts the background retries not started for want of a slot.
	retriesSkipped prometheus.Counter
}

func initCollectors() {
	const ns, sub = "caddy", "idempotency"
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: ns, Subsystem: sub, Name: name, Help: help}
	}
	collectors.requests = prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
		"Requests seen by the idempotency handler, by result.")), []string{"result"})
	collectors.storeOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_operation_duration_seconds",
		Help:    "Latency of idempotency store operations, by store and operation.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"store", "operation"})
	collectors.storeErrs = prometheus.NewCounterVec(prometheus.CounterOpts(opts("store_errors_total",
		"Idempotency store operations that failed because the store was unavailable.")), []string{"store", "operation"})
	collectors.unreadable = prometheus.NewCounterVec(prometheus.CounterOpts(opts("unreadable_records_total",
		"Stored responses refused because no configured encryption key opens them (unknown_key), they fail authentication (authentication), are malformed, or are not sealed although keys are configured (unsealed).")), []string{"reason"})
	collectors.inFlight = prometheus.NewGauge(prometheus.GaugeOpts(opts("in_flight_claims",
		"Claims held by requests running in this process.")))
	collectors.renewals = prometheus.NewCounter(prometheus.CounterOpts(opts("lease_renewals_total",
		"Lease renewals of claims held by long-running requests.")))
	collectors.takeovers = prometheus.NewCounter(prometheus.CounterOpts(opts("lease_takeovers_total",
		"Claims that took over a dead owner's claim after its lease passed.")))
	collectors.retriesSkipped = prometheus.NewCounter(prometheus.CounterOpts(opts("background_retries_skipped_total",
		"Store calls that a request left to retry in the background (storing its response, withdrawing its claim) but that were not started because every background slot was busy; their claims expire by their lease.")))
	collectors.waiting = prometheus.NewGauge(prometheus.GaugeOpts(opts("waiting_duplicates",
		"Duplicates waiting for the first request with their key (on_conflict wait).")))
}

// metrics is a handler's view of the collectors; a nil one records nothing.
type metrics struct {
	results [numResults]prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	collectors.once.Do(initCollectors)
	for _, c := range []prometheus.Collector{collectors.requests, collectors.storeOps, collectors.storeErrs,
		collectors.inFlight, collectors.renewals, collectors.takeovers, collectors.waiting, collectors.unreadable,
		collectors.retriesSkipped} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, err
		}
	}
	for _, reason := range []string{"unknown_key", "authentication", "malformed", "unsealed"} {
		collectors.unreadable.WithLabelValues(reason) // exported at 0, so rules see the first
	}
	m := new(metrics)
	for r := range numResults {
		m.results[r] = collectors.requests.WithLabelValues(results[r].label)
	}
	return m, nil
}

// publish sets the request's result placeholder, and counts it.
func (m *metrics) publish(repl *caddy.Replacer, r result) {
	repl.Set("http.idempotency.result", results[r].value)
	if m != nil {
		m.results[r].Inc()
	}
}

// add adds delta to c, a process-wide gauge or counter, unless m is nil.
func (m *metrics) add(c interface{ Add(float64) }, delta float64) {
	if m != nil {
		c.Add(delta)
	}
}

func (m *metrics) claimHeld(delta float64) { m.add(collectors.inFlight, delta) }
func (m *metrics) renewed()                { m.add(collectors.renewals, 1) }
func (m *metrics) tookOver()               { m.add(collectors.takeovers, 1) }
func (m *metrics) waiter(delta float64)    { m.add(collectors.waiting, delta) }
func (m *metrics) retrySkipped()           { m.add(collectors.retriesSkipped, 1) }

func (m *metrics) unreadable(reason string) {
	if m != nil {
		collectors.unreadable.WithLabelValues(reason).Inc()
	}
}
