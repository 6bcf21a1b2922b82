package idempotency

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

const (
	rulesPath     = "docs/prometheus/idempotency-rules.yml"
	rulesTestPath = "docs/prometheus/idempotency-rules.test.yml"
	// operationsPath documents the metrics and the alerts.
	operationsPath = "docs/operations.md"
)

type ruleFile struct {
	Groups []struct {
		Name  string      `yaml:"name"`
		Rules []alertRule `yaml:"rules"`
	} `yaml:"groups"`
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func (f ruleFile) rules() []alertRule {
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// ruleTestFile is the part of promtool's unit test file that names series.
type ruleTestFile struct {
	Tests []struct {
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
	} `yaml:"tests"`
}

func (f ruleTestFile) series() []string {
	var series []string
	for _, tc := range f.Tests {
		for _, s := range tc.InputSeries {
			series = append(series, s.Series)
		}
	}
	return series
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	// Strict: a misspelt key (anotations) would drop what it holds.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f ruleFile
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return f
}

func loadRuleTests(t *testing.T) ruleTestFile {
	t.Helper()
	data, err := os.ReadFile(rulesTestPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleTestFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestPath, err)
	}
	return f
}

var (
	severities     = setOf("critical", "warning", "info")
	labelTemplate  = regexp.MustCompile(`\$labels\.(\w+)`)
	yamlCodeBlocks = regexp.MustCompile("(?s)```yaml\n(.*?)```")
)

// Every alert tells the operator how urgent it is, what happened and
// where the docs say what to do; the operations page's excerpt is the
// file's text.
func TestRulesFile(t *testing.T) {
	rules := loadRules(t).rules()
	if len(rules) == 0 {
		t.Fatal("no rules")
	}
	seen := make(map[string]bool)
	for _, r := range rules {
		if r.Alert == "" || seen[r.Alert] {
			t.Errorf("rule %q: no alert name, or a repeated one", r.Alert)
		}
		seen[r.Alert] = true
		if _, err := model.ParseDuration(r.For); err != nil {
			t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
		}
		if !severities[r.Labels["severity"]] {
			t.Errorf("%s: severity %q, want one of %v", r.Alert, r.Labels["severity"], sortedKeys(severities))
		}
		for _, a := range []string{"summary", "description", "runbook"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if err := checkDocLink(r.Annotations["runbook"]); err != nil {
			t.Errorf("%s: runbook: %v", r.Alert, err)
		}
		refs, err := parsePromQL(r.Expr)
		if err != nil {
			t.Errorf("%s: %v", r.Alert, err)
			continue
		}
		// An annotation can only show the labels the expression keeps.
		for _, a := range sortedKeys(r.Annotations) {
			for _, m := range labelTemplate.FindAllStringSubmatch(r.Annotations[a], -1) {
				if !slices.Contains(refs.grouping, m[1]) {
					t.Errorf("%s: the %s annotation shows $labels.%s, which the expression aggregates away", r.Alert, a, m[1])
				}
			}
		}
	}

	rulesText, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	_, metrics, _ := strings.Cut(string(ops), "\n## Metrics\n")
	metrics, _, _ = strings.Cut(metrics, "\n## ")
	for _, r := range rules {
		if !strings.Contains(metrics, fmt.Sprintf("| `%s` | %s |", r.Alert, r.Labels["severity"])) {
			t.Errorf("%s: the Metrics section's table lacks %s (%s)", operationsPath, r.Alert, r.Labels["severity"])
		}
	}
	blocks := yamlCodeBlocks.FindAllStringSubmatch(metrics, -1)
	if len(blocks) == 0 {
		t.Errorf("%s: the Metrics section shows no rule", operationsPath)
	}
	for _, b := range blocks {
		if !strings.Contains(string(rulesText), b[1]) {
			t.Errorf("%s: the Metrics section's excerpt is not in %s:\n%s", operationsPath, rulesPath, b[1])
		}
	}
}

// promtool is Prometheus's own judge of the rules: check rules validates
// them, test rules runs their unit tests. test.sh installs it; CI never
// skips it.
func TestRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not on PATH; CI must check the alerting rules (test.sh installs the prometheus package)")
		}
		t.Skip("promtool is not on PATH: install it (Debian's prometheus package, or run ./test.sh as root) to check the alerting rules")
	}
	for _, args := range [][]string{{"check", "rules", rulesPath}, {"test", "rules", rulesTestPath}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// checkDocLink checks a link to this repository's docs, path#anchor,
// against the file's headings and explicit anchors.
func checkDocLink(link string) error {
	path, anchor, ok := strings.Cut(link, "#")
	if !ok || anchor == "" {
		return fmt.Errorf("%q: want path#anchor", link)
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !markdownAnchors(string(text))[anchor] {
		return fmt.Errorf("%s has no anchor %q", path, anchor)
	}
	return nil
}

var explicitAnchor = regexp.MustCompile(`<a id="([^"]+)"></a>`)

// markdownAnchors are the anchors a Markdown page has on GitHub: one for
// each heading (lower case, punctuation dropped, spaces as hyphens,
// repeats numbered) and the <a id> ones.
func markdownAnchors(text string) map[string]bool {
	anchors := make(map[string]bool)
	for _, m := range explicitAnchor.FindAllStringSubmatch(text, -1) {
		anchors[m[1]] = true
	}
	count := make(map[string]int)
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		heading := strings.TrimLeft(line, "#")
		if fenced || heading == line || !strings.HasPrefix(heading, " ") {
			continue
		}
		var slug strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := count[s]; n > 0 {
			anchors[s+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[s] = true
		}
		count[s]++
	}
	return anchors
}
