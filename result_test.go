package idempotency

import "testing"

// The placeholder values and metric labels are an interface: access log
// formats and dashboards match them. A result without a row in results
// would publish no placeholder and count under an empty label.
func TestResultNames(t *testing.T) {
	want := map[string]string{
		"new": "new", "replay": "replay", "conflict": "conflict", "mismatch": "mismatch",
		"bypass": "bypass", "invalid": "invalid", "too_large": "too_large", "error": "store_error",
		"unknown": "unknown", "client_gone": "client_gone", "missing_scope": "missing_scope",
		"unreplayable": "unreplayable", "not_acceptable": "not_acceptable", "unreadable": "unreadable",
		"replay_busy": "replay_busy",
	}
	for r := range numResults {
		value := results[r].value
		label, ok := want[value]
		if !ok || results[r].label != label {
			t.Errorf("result %d is %q, counted as %q; want one of %v", r, value, results[r].label, want)
		}
		delete(want, value)
	}
	if len(want) != 0 {
		t.Errorf("no result publishes %v", want)
	}
}
