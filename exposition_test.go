package idempotency

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// exposition is what a /metrics page exports, as a query sees it: the
// series names (a histogram is its _bucket, _sum and _count series), each
// with the values seen for each of its labels.
type exposition struct {
	series   map[string]map[string]map[string]bool
	families map[string][]string // family name → its series names
}

// scrapeLabels are attached by Prometheus when it scrapes a target, so
// every series has them although no exporter writes them.
var scrapeLabels = setOf("job", "instance")

func readExposition(r io.Reader) (exposition, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return exposition{}, fmt.Errorf("parsing the exposition: %w", err)
	}
	return exposeFamilies(fams), nil
}

func exposeFamilies(fams map[string]*dto.MetricFamily) exposition {
	e := exposition{series: make(map[string]map[string]map[string]bool), families: make(map[string][]string)}
	add := func(family, series string, m *dto.Metric, extra ...string) {
		labels := e.series[series]
		if labels == nil {
			labels = make(map[string]map[string]bool)
			e.series[series] = labels
			e.families[family] = append(e.families[family], series)
		}
		pairs := m.GetLabel()
		for _, p := range pairs {
			if labels[p.GetName()] == nil {
				labels[p.GetName()] = make(map[string]bool)
			}
			labels[p.GetName()][p.GetValue()] = true
		}
		for i := 0; i+1 < len(extra); i += 2 {
			if labels[extra[i]] == nil {
				labels[extra[i]] = make(map[string]bool)
			}
			labels[extra[i]][extra[i+1]] = true
		}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				add(name, name+"_bucket", m, "le", "+Inf")
				for _, b := range m.GetHistogram().GetBucket() {
					add(name, name+"_bucket", m, "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
				}
				add(name, name+"_sum", m)
				add(name, name+"_count", m)
			case dto.MetricType_SUMMARY:
				add(name, name, m)
				for _, q := range m.GetSummary().GetQuantile() {
					add(name, name, m, "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64))
				}
				add(name, name+"_sum", m)
				add(name, name+"_count", m)
			default:
				add(name, name, m)
			}
		}
	}
	return e
}

// check finds what an expression names that the exposition lacks: a
// metric, a label of a metric, a literal label value, or a by/on label
// that none of the metrics it reads has.
func (e exposition) check(expr string) []error {
	refs, err := parsePromQL(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	read := make(map[string]bool)
	for l := range scrapeLabels {
		read[l] = true
	}
	for _, s := range refs.selectors {
		labels, ok := e.series[s.metric]
		if !ok {
			errs = append(errs, fmt.Errorf("metric %s is not exported", s.metric))
			continue
		}
		for l := range labels {
			read[l] = true
		}
		for _, m := range s.matchers {
			if scrapeLabels[m.label] {
				continue
			}
			values, ok := labels[m.label]
			if !ok {
				errs = append(errs, fmt.Errorf("metric %s has no label %s", s.metric, m.label))
				continue
			}
			for _, v := range literalValues(m) {
				if !values[v] {
					errs = append(errs, fmt.Errorf("%s{%s} is never %q (seen: %s)", s.metric, m.label, v, strings.Join(sortedKeys(values), ", ")))
				}
			}
		}
	}
	for _, l := range refs.grouping {
		if !read[l] {
			errs = append(errs, fmt.Errorf("label %s is on none of the metrics the expression reads", l))
		}
	}
	return errs
}

var (
	literalAlternatives = regexp.MustCompile(`^[\w-]+(\|[\w-]+)*$`)
	labelValuesQuery    = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?(\w+)\s*\)\s*$`)
	queryResultQuery    = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

// literalValues are the values a matcher names outright, to be checked
// against what was exported: the value of = and !=, the alternatives of a
// regular expression made of words and |. Patterns and Grafana variables
// match what they match, unchecked.
func literalValues(m promMatcher) []string {
	if m.value == "" || strings.Contains(m.value, "$") {
		return nil
	}
	switch m.op {
	case "=", "!=":
		return []string{m.value}
	}
	if literalAlternatives.MatchString(m.value) {
		return strings.Split(m.value, "|")
	}
	return nil
}

// checkVariableQuery checks a Grafana template variable's Prometheus
// query: label_values([selector,] label) or query_result(expr).
func (e exposition) checkVariableQuery(q string) []error {
	if m := queryResultQuery.FindStringSubmatch(q); m != nil {
		return e.check(m[1])
	}
	m := labelValuesQuery.FindStringSubmatch(q)
	if m == nil {
		return []error{fmt.Errorf("variable query %q is neither label_values nor query_result", q)}
	}
	label := m[2]
	if m[1] == "" {
		for _, labels := range e.series {
			if labels[label] != nil {
				return nil
			}
		}
		if scrapeLabels[label] {
			return nil
		}
		return []error{fmt.Errorf("label %s is on no exported metric", label)}
	}
	// The selector's labels are what label_values lists from.
	return e.check(fmt.Sprintf("group by (%s) (%s)", label, m[1]))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The checker must catch a misspelt metric, label or value, or it proves
// nothing about the dashboard and rules it is pointed at.
func TestDashboardQueryChecker(t *testing.T) {
	exp, err := readExposition(strings.NewReader(`# TYPE caddy_idempotency_requests_total counter
caddy_idempotency_requests_total{result="new"} 3
caddy_idempotency_requests_total{result="replay"} 1
# TYPE caddy_idempotency_in_flight_claims gauge
caddy_idempotency_in_flight_claims 0
# TYPE caddy_idempotency_store_operation_duration_seconds histogram
caddy_idempotency_store_operation_duration_seconds_bucket{operation="acquire",store="memory",le="0.001"} 4
caddy_idempotency_store_operation_duration_seconds_bucket{operation="acquire",store="memory",le="+Inf"} 4
caddy_idempotency_store_operation_duration_seconds_sum{operation="acquire",store="memory"} 0.0002
caddy_idempotency_store_operation_duration_seconds_count{operation="acquire",store="memory"} 4
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 9
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		expr string
		want string // a part of the first error; "" for none
	}{
		{`sum by (result) (rate(caddy_idempotency_requests_total{job=~"$job", instance=~"$instance"}[$__rate_interval]))`, ""},
		{`histogram_quantile(0.99, sum by (le, store, operation) (rate(caddy_idempotency_store_operation_duration_seconds_bucket{operation="acquire"}[5m])))`, ""},
		{`sum(rate(caddy_idempotency_requests_total{result="replay"}[5m])) / sum(rate(caddy_idempotency_requests_total{result=~"new|replay"}[5m]))`, ""},
		{`max_over_time(caddy_idempotency_in_flight_claims[1h:5m] offset 1d) > bool 0 and on (instance) group_left caddy_idempotency_requests_total`, ""},
		{`{__name__="caddy_idempotency_in_flight_claims"} @ start()`, ""},
		{`go_gc_duration_seconds{quantile="0.5"} + go_gc_duration_seconds_count * 1e-3 - Inf`, ""},
		{"# a comment\nsum without (result) (caddy_idempotency_requests_total{result!~'new|replay'})", ""},

		{`rate(caddy_idempotency_request_total[5m])`, "metric caddy_idempotency_request_total is not exported"},
		{`caddy_idempotency_store_operation_duration_seconds`, "metric caddy_idempotency_store_operation_duration_seconds is not exported"},
		{`caddy_idempotency_requests_total{reslt="new"}`, "has no label reslt"},
		{`caddy_idempotency_store_operation_duration_seconds_count{le="+Inf"}`, "has no label le"},
		{`caddy_idempotency_requests_total{result="replays"}`, `is never "replays"`},
		{`caddy_idempotency_requests_total{result=~"new|replays"}`, `is never "replays"`},
		{`sum by (results) (caddy_idempotency_requests_total)`, "label results is on none"},
		{`histogram_quantile(0.9, sum by (le) (caddy_idempotency_store_operation_duration_seconds_count))`, "label le is on none"},
		{`histogram_quantil(0.9, caddy_idempotency_store_operation_duration_seconds_bucket)`, "unknown function histogram_quantil"},
		{`label_replace(caddy_idempotency_in_flight_claims, "x", "$1", "instance", "(.*)")`, "unknown function label_replace"},
		{`{result="new"}`, "without a metric name"},
		{`sum(rate(caddy_idempotency_requests_total[5m])`, "unbalanced"},
		{`caddy_idempotency_requests_total{result="new"`, "malformed label matcher"},
		{`sum by caddy_idempotency_requests_total`, "by without a label list"},
	} {
		errs := exp.check(tc.expr)
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("%s: %v", tc.expr, errs)
		case tc.want != "" && len(errs) == 0:
			t.Errorf("%s: no error, want %q", tc.expr, tc.want)
		case tc.want != "" && !strings.Contains(errs[0].Error(), tc.want):
			t.Errorf("%s: %v, want %q", tc.expr, errs[0], tc.want)
		}
	}

	for _, tc := range []struct {
		query string
		want  string
	}{
		{`label_values(caddy_idempotency_requests_total, job)`, ""},
		{`label_values(caddy_idempotency_requests_total{job=~"$job"}, instance)`, ""},
		{`label_values(result)`, ""},
		{`query_result(sum(caddy_idempotency_in_flight_claims))`, ""},
		{`label_values(caddy_idempotency_requests_total, store)`, "label store is on none"},
		{`label_values(caddy_idempotency_request_total, job)`, "not exported"},
		{`label_values(stor)`, "label stor is on no exported metric"},
		{`metrics(caddy_.*)`, "neither label_values nor query_result"},
	} {
		errs := exp.checkVariableQuery(tc.query)
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("%s: %v", tc.query, errs)
		case tc.want != "" && (len(errs) == 0 || !strings.Contains(errs[0].Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.query, errs, tc.want)
		}
	}
}
