package idempotency

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/app"
)

// markdownLink matches an inline link or image target: [text](target) or
// [text](target "title").
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocsLinks checks every relative link of the Markdown documentation:
// the file it names exists, and the anchor it names is a heading (or an
// explicit anchor) of that file. Problem types link README anchors by
// absolute URL: they are checked too.
func TestDocsLinks(t *testing.T) {
	files := markdownFiles(t)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		a := markdownAnchors(string(b))
		anchors[path] = a
		return a
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(withoutCodeBlocks(string(b)), "\n") {
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := path
				if file != "" {
					dest = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", path, n+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link to %s: %s has no anchor #%s", path, n+1, target, dest, anchor)
				}
			}
		}
	}
	probs := newProblems(app.DefaultProblemBase, &keySource{header: "Idempotency-Key", where: "the Idempotency-Key request header", what: "The Idempotency-Key header"}, 1, 1)
	for _, p := range probs {
		anchor := strings.TrimPrefix(p.typ, docsURL)
		if !anchorsOf("README.md")[anchor] {
			t.Errorf("problem type %s: README.md has no anchor #%s", p.typ, anchor)
		}
	}
}

// markdownFiles lists the documentation: every .md file of the repository
// outside hidden folders and benchmark output.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || path == filepath.Join("bench", "out")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	return files
}

// withoutCodeBlocks blanks the lines of fenced code blocks, keeping the line
// count, so that code is not read as links or headings.
func withoutCodeBlocks(doc string) string {
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

func TestMarkdownAnchors(t *testing.T) {
	doc := "# caddy\n### Waiting duplicates and `local_cache` over LISTEN/NOTIFY\n## file (durable, single instance)\n" +
		"```\n# not a heading\n```\n## Notes\n## Notes\n<a id=\"store-unavailable\"></a>\n"
	got := markdownAnchors(doc)
	for _, want := range []string{"caddy", "waiting-duplicates-and-local_cache-over-listennotify",
		"file-durable-single-instance", "notes", "notes-1", "store-unavailable"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block made an anchor")
	}
}
