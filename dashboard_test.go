package idempotency

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

const dashboardPath = "docs/grafana/idempotency.json"

// dashboardQuery is one PromQL query of the dashboard: a panel target's
// or a template variable's.
type dashboardQuery struct {
	where    string
	expr     string
	variable bool
}

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return dash
}

// dashboardQueries finds every query: the targets of panels at any depth
// (a collapsed row holds its panels), and the query variables.
func dashboardQueries(t *testing.T, dash map[string]any) []dashboardQuery {
	t.Helper()
	var qs []dashboardQuery
	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = fmt.Sprintf("panel %q", title)
			}
			if expr, ok := v["expr"].(string); ok {
				qs = append(qs, dashboardQuery{where: fmt.Sprintf("%s, target %v", where, v["refId"]), expr: expr})
			}
			for _, k := range sortedKeys(v) {
				if k != "templating" {
					walk(v[k], where)
				}
			}
		case []any:
			for _, x := range v {
				walk(x, where)
			}
		}
	}
	walk(dash, "dashboard")
	for _, v := range templateVariables(t, dash) {
		if v["type"] != "query" {
			continue
		}
		q, ok := v["query"].(string)
		if m, isMap := v["query"].(map[string]any); isMap {
			q, ok = m["query"].(string)
		}
		if !ok || q == "" {
			t.Errorf("variable %v: no query", v["name"])
			continue
		}
		qs = append(qs, dashboardQuery{where: fmt.Sprintf("variable %v", v["name"]), expr: q, variable: true})
	}
	return qs
}

func templateVariables(t *testing.T, dash map[string]any) []map[string]any {
	t.Helper()
	templating, _ := dash["templating"].(map[string]any)
	list, ok := templating["list"].([]any)
	if !ok {
		t.Fatal("dashboard: no templating.list")
	}
	vars := make([]map[string]any, 0, len(list))
	for _, v := range list {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("templating.list holds %T", v)
		}
		vars = append(vars, m)
	}
	return vars
}

// grafanaVariable is a variable reference in a query: $name, ${name} or
// ${name:format}.
var grafanaVariable = regexp.MustCompile(`\$(?:\{(\w+)(?::\w+)?\}|(\w+))`)

// What Grafana needs to import the dashboard, and what makes it portable:
// every datasource is the ${datasource} variable, never a UID of the
// machine it was made on.
func TestDashboardShape(t *testing.T) {
	dash := loadDashboard(t)
	if title, _ := dash["title"].(string); title == "" {
		t.Error("no title")
	}
	if uid, _ := dash["uid"].(string); uid == "" || len(uid) > 40 {
		t.Errorf("uid %q: want 1 to 40 characters", uid)
	}
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: Grafana 10 and 11 import 36 and later", dash["schemaVersion"])
	}
	if _, ok := dash["__inputs"]; ok {
		t.Error("__inputs: the datasource is a template variable, not an import-time input")
	}

	defined := make(map[string]bool)
	for _, v := range templateVariables(t, dash) {
		name, _ := v["name"].(string)
		defined[name] = true
		if name == "datasource" && (v["type"] != "datasource" || v["query"] != "prometheus") {
			t.Errorf("variable datasource is %v of %v, want a datasource variable of prometheus", v["type"], v["query"])
		}
	}
	if !defined["datasource"] {
		t.Error("no datasource variable")
	}

	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			switch ds := v["datasource"].(type) {
			case nil:
			case map[string]any:
				if ds["uid"] != "${datasource}" && ds["type"] != "grafana" {
					t.Errorf("%s: datasource %v, want ${datasource}", where, ds)
				}
			case string:
				if ds != "${datasource}" && ds != "prometheus" {
					t.Errorf("%s: datasource %q, want ${datasource}", where, ds)
				}
			}
			for _, k := range sortedKeys(v) {
				walk(v[k], where+"."+k)
			}
		case []any:
			for i, x := range v {
				walk(x, fmt.Sprintf("%s[%d]", where, i))
			}
		}
	}
	walk(dash, "dashboard")

	panels, ok := dash["panels"].([]any)
	if !ok || len(panels) == 0 {
		t.Fatal("no panels")
	}
	ids := make(map[float64]string)
	var checkPanels func(list []any)
	checkPanels = func(list []any) {
		for _, p := range list {
			p, ok := p.(map[string]any)
			if !ok {
				t.Fatalf("a panel is %T", p)
			}
			title, _ := p["title"].(string)
			id, _ := p["id"].(float64)
			if other, dup := ids[id]; dup || id == 0 {
				t.Errorf("panel %q: id %v missing or also %q's", title, p["id"], other)
			}
			ids[id] = title
			grid, _ := p["gridPos"].(map[string]any)
			x, _ := grid["x"].(float64)
			w, _ := grid["w"].(float64)
			h, _ := grid["h"].(float64)
			if w <= 0 || h <= 0 || x < 0 || x+w > 24 {
				t.Errorf("panel %q: gridPos %v outside the 24 columns", title, grid)
			}
			if p["type"] == "row" {
				nested, _ := p["panels"].([]any)
				if p["collapsed"] == true && len(nested) == 0 {
					t.Errorf("row %q: collapsed with no panels", title)
				}
				checkPanels(nested)
				continue
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q: no targets", title)
			}
			refIDs := make(map[string]bool)
			for _, tg := range targets {
				tg, _ := tg.(map[string]any)
				ref, _ := tg["refId"].(string)
				if expr, _ := tg["expr"].(string); expr == "" || ref == "" || refIDs[ref] {
					t.Errorf("panel %q: target %v without expr or with a repeated refId", title, tg)
				}
				refIDs[ref] = true
			}
		}
	}
	checkPanels(panels)

	for _, q := range dashboardQueries(t, dash) {
		for _, m := range grafanaVariable.FindAllStringSubmatch(q.expr, -1) {
			name := m[1] + m[2]
			if !defined[name] && !strings.HasPrefix(name, "__") {
				t.Errorf("%s: $%s is not a variable of the dashboard", q.where, name)
			}
		}
	}
}
