package idempotency

import (
	"fmt"
	"strconv"
	"strings"
)

// The dashboard and alert tests read PromQL with this small scanner rather
// than Prometheus's parser, whose module would bring most of Prometheus
// into go.mod. It understands what those files write: selectors with
// matchers, functions, aggregations with by/without, vector matching,
// ranges, subqueries, offsets, and Grafana's $variables. What it does not
// know, it refuses, so that a query it cannot check fails the test instead
// of passing unchecked.

// promRefs is what one expression reads: the series it selects and the
// label names its by, without, on, ignoring, group_left and group_right
// clauses name.
type promRefs struct {
	selectors []promSelector
	grouping  []string
}

type promSelector struct {
	metric   string
	matchers []promMatcher
}

type promMatcher struct{ label, op, value string }

type promTokenKind int

const (
	tokIdent promTokenKind = iota
	tokString
	tokNumber // a number or a duration
	tokVar    // a Grafana variable: $name, ${name}, ${name:format}
	tokPunct  // brackets, commas and operators
)

type promToken struct {
	kind promTokenKind
	text string // a string's value, unquoted
}

func (t promToken) is(punct string) bool { return t.kind == tokPunct && t.text == punct }

// promFunctions are the functions of PromQL. label_replace, label_join
// and the count_values aggregation are left out: they make labels that no
// exporter has, which this scanner cannot follow.
var promFunctions = setOf("abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan",
	"atanh", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
	"count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta",
	"deriv", "double_exponential_smoothing", "end", "exp", "floor", "histogram_avg", "histogram_count",
	"histogram_fraction", "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
	"holt_winters", "hour", "idelta", "increase", "irate", "last_over_time", "ln", "log10", "log2",
	"mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear",
	"present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin",
	"sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt", "start",
	"stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
	"vector", "year")

var promPuncts = setOf("(", ")", "{", "}", "[", "]", ",", ":", "@", "+", "-", "*", "/", "%", "^",
	"==", "!=", "<", "<=", ">", ">=", "=", "=~", "!~")

var promAggregations = setOf("avg", "bottomk", "count", "group", "limit_ratio", "limitk", "max", "min",
	"quantile", "stddev", "stdvar", "sum", "topk")

// Keywords are case-insensitive in PromQL.
var (
	promGroupings = setOf("by", "without", "on", "ignoring", "group_left", "group_right")
	promOperators = setOf("and", "or", "unless", "bool", "offset", "atan2")
	promNumbers   = setOf("inf", "nan")
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// parsePromQL finds the metrics and labels an expression names.
func parsePromQL(expr string) (promRefs, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return promRefs{}, err
	}
	var refs promRefs
	depth := 0
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := promToken{}
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case t.is("("):
			depth++
		case t.is(")"):
			if depth--; depth < 0 {
				return refs, fmt.Errorf("unbalanced ')'")
			}
		case t.is("["):
			// a range or subquery: durations and variables only
			j := i + 1
			for j < len(toks) && !toks[j].is("]") {
				if k := toks[j].kind; k != tokNumber && k != tokVar && !toks[j].is(":") {
					return refs, fmt.Errorf("unexpected %q in a range", toks[j].text)
				}
				j++
			}
			if j == len(toks) {
				return refs, fmt.Errorf("unclosed '['")
			}
			i = j
		case t.is("{"):
			sel, end, err := parseMatchers(toks, i)
			if err != nil {
				return refs, err
			}
			if sel.metric == "" {
				return refs, fmt.Errorf("a selector without a metric name: %s", joinTokens(toks[i:end+1]))
			}
			refs.selectors = append(refs.selectors, sel)
			i = end
		case t.kind == tokIdent:
			lower := strings.ToLower(t.text)
			switch {
			case promGroupings[lower]:
				if !next.is("(") {
					if lower == "group_left" || lower == "group_right" {
						continue
					}
					return refs, fmt.Errorf("%s without a label list", t.text)
				}
				labels, end, err := parseLabelList(toks, i+1)
				if err != nil {
					return refs, fmt.Errorf("%s: %w", t.text, err)
				}
				refs.grouping = append(refs.grouping, labels...)
				i = end
			case promOperators[lower] || promNumbers[lower]:
			case promAggregations[lower]:
				if !next.is("(") && !(next.kind == tokIdent && promGroupings[strings.ToLower(next.text)]) {
					return refs, fmt.Errorf("aggregation %s without its argument", t.text)
				}
			case next.is("("):
				if !promFunctions[t.text] {
					return refs, fmt.Errorf("unknown function %s (label_replace, label_join and count_values are not understood here)", t.text)
				}
			default:
				sel := promSelector{metric: t.text}
				if next.is("{") {
					s, end, err := parseMatchers(toks, i+1)
					if err != nil {
						return refs, err
					}
					if s.metric != "" {
						return refs, fmt.Errorf("%s has a second name in __name__", t.text)
					}
					sel.matchers = s.matchers
					i = end
				}
				refs.selectors = append(refs.selectors, sel)
			}
		}
	}
	if depth != 0 {
		return refs, fmt.Errorf("unbalanced '('")
	}
	return refs, nil
}

// parseMatchers reads {label op "value", ...} from toks[open], which is
// "{", and returns the index of its "}". A __name__ matcher gives the
// metric's name.
func parseMatchers(toks []promToken, open int) (promSelector, int, error) {
	var sel promSelector
	i := open + 1
	for {
		if i < len(toks) && toks[i].is("}") {
			return sel, i, nil
		}
		if i+2 >= len(toks) || toks[i].kind != tokIdent || toks[i+1].kind != tokPunct || toks[i+2].kind != tokString {
			return sel, 0, fmt.Errorf("malformed label matcher in %s", joinTokens(toks[open:min(len(toks), i+3)]))
		}
		m := promMatcher{label: toks[i].text, op: toks[i+1].text, value: toks[i+2].text}
		switch m.op {
		case "=", "!=", "=~", "!~":
		default:
			return sel, 0, fmt.Errorf("unknown matcher operator %q", m.op)
		}
		if m.label == "__name__" {
			if m.op != "=" {
				return sel, 0, fmt.Errorf("__name__%s%q selects metrics this check cannot name", m.op, m.value)
			}
			sel.metric = m.value
		} else {
			sel.matchers = append(sel.matchers, m)
		}
		i += 3
		if i < len(toks) && toks[i].is(",") {
			i++
		}
	}
}

// parseLabelList reads (label, ...) from toks[open], which is "(".
func parseLabelList(toks []promToken, open int) ([]string, int, error) {
	var labels []string
	for i := open + 1; i < len(toks); i++ {
		switch t := toks[i]; {
		case t.is(")"):
			return labels, i, nil
		case t.is(","):
		case t.kind == tokIdent:
			labels = append(labels, t.text)
		default:
			return nil, 0, fmt.Errorf("unexpected %q in a label list", t.text)
		}
	}
	return nil, 0, fmt.Errorf("unclosed label list")
}

func lexPromQL(s string) ([]promToken, error) {
	var toks []promToken
	// Metric names may hold colons (recording rules), but not begin with
	// one here: "[5m:1m]" is a subquery.
	isWord := func(c byte) bool {
		return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
	}
	isIdentStart := func(c byte) bool { return isWord(c) && !('0' <= c && c <= '9') }
	isIdent := func(c byte) bool { return isWord(c) || c == ':' }
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at %q", s[i:])
			}
			val := s[i+1 : j]
			if c != '`' && strings.Contains(val, `\`) {
				u, err := strconv.Unquote(`"` + strings.ReplaceAll(val, `\'`, `'`) + `"`)
				if err != nil {
					return nil, fmt.Errorf("bad escape in %s: %w", s[i:j+1], err)
				}
				val = u
			}
			toks = append(toks, promToken{tokString, val})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				end := strings.IndexByte(s[j:], '}')
				if end < 0 {
					return nil, fmt.Errorf("unclosed variable at %q", s[i:])
				}
				j += end + 1
			} else {
				for j < len(s) && isWord(s[j]) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("a lone '$' in %q", s)
			}
			toks = append(toks, promToken{tokVar, s[i:j]})
			i = j
		case '0' <= c && c <= '9' || c == '.' && i+1 < len(s) && '0' <= s[i+1] && s[i+1] <= '9':
			j := i
			for j < len(s) && (isWord(s[j]) || s[j] == '.' ||
				(s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E') && !strings.ContainsAny(s[i:j], "xX")) {
				j++
			}
			toks = append(toks, promToken{tokNumber, s[i:j]})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			toks = append(toks, promToken{tokIdent, s[i:j]})
			i = j
		default:
			op := string(c)
			if i+1 < len(s) {
				switch two := s[i : i+2]; two {
				case "==", "!=", "<=", ">=", "=~", "!~":
					op = two
				}
			}
			if !promPuncts[op] {
				return nil, fmt.Errorf("unexpected %q in %q", op, s)
			}
			toks = append(toks, promToken{tokPunct, op})
			i += len(op)
		}
	}
	return toks, nil
}

func joinTokens(toks []promToken) string {
	parts := make([]string, len(toks))
	for i, t := range toks {
		parts[i] = t.text
		if t.kind == tokString {
			parts[i] = strconv.Quote(t.text)
		}
	}
	return strings.Join(parts, " ")
}
