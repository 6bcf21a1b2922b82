package idempotency

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/store/file"
	"github.com/caddy-idempotency/caddy-idempotency/store/memory"
	"github.com/caddy-idempotency/caddy-idempotency/store/postgres"
	"github.com/caddy-idempotency/caddy-idempotency/store/redis"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/json.md from the godoc of the config structs")

// jsonReferencePath is the generated JSON config reference.
const jsonReferencePath = "docs/json.md"

// refModule is one Caddy module of the JSON reference: where its config
// struct is declared, and a value of it to check the parse against.
type refModule struct {
	title   string // section heading
	anchor  string // the heading's Markdown anchor
	id      string // Caddy module ID
	file    string // Go source file that declares the struct
	typ     string // the struct's name in that file
	value   any    // a value of the struct, for the reflection cross-check
	where   string // how the module appears in a config, Markdown
	page    string // the operator's page, if any
	flatten bool   // embedded structs: list their fields here (else refer)
}

var refModules = []refModule{
	{
		title:   "Handler",
		anchor:  "handler",
		id:      "http.handlers.idempotency",
		file:    "module.go",
		typ:     "Handler",
		value:   Handler{},
		flatten: true,
		where:   "an object in a route's `handle` array, with `\"handler\": \"idempotency\"`. The Caddyfile's `idempotency` directive adapts to it.",
	},
	{
		title:  "App",
		anchor: "app",
		id:     "idempotency",
		file:   "app/app.go",
		typ:    "App",
		value:  app.App{},
		where:  "`{\"apps\": {\"idempotency\": {...}}}`, next to the `http` app. The Caddyfile's `idempotency` global option adapts to it.",
	},
	{
		title:  "Store memory",
		anchor: "store-memory",
		id:     "http.idempotency.stores.memory",
		file:   "store/memory/memory.go",
		typ:    "Memory",
		value:  memory.Memory{},
		where:  "`\"store\": {\"module\": \"memory\", ...}` in the handler or the app.",
		page:   "stores/memory.md",
	},
	{
		title:  "Store redis",
		anchor: "store-redis",
		id:     "http.idempotency.stores.redis",
		file:   "store/redis/redis.go",
		typ:    "Store",
		value:  redis.Store{},
		where:  "`\"store\": {\"module\": \"redis\", ...}` in the handler or the app.",
		page:   "stores/redis.md",
	},
	{
		title:  "Store file",
		anchor: "store-file",
		id:     "http.idempotency.stores.file",
		file:   "store/file/file.go",
		typ:    "Store",
		value:  file.Store{},
		where:  "`\"store\": {\"module\": \"file\", ...}` in the handler or the app.",
		page:   "stores/file.md",
	},
	{
		title:  "Store postgres",
		anchor: "store-postgres",
		id:     "http.idempotency.stores.postgres",
		file:   "store/postgres/postgres.go",
		typ:    "Store",
		value:  postgres.Store{},
		where:  "`\"store\": {\"module\": \"postgres\", ...}` in the handler or the app.",
		page:   "stores/postgres.md",
	},
}

// refField is one JSON field of a config struct.
type refField struct {
	goName string
	json   string
	typ    string // readable JSON type
	def    string // from the "Default: X." sentence, Markdown
	doc    string // the godoc, one paragraph, without the default
}

// refStruct is a parsed config struct.
type refStruct struct {
	doc    string     // the type's godoc, Markdown
	fields []refField // own fields with a json tag
	embeds []refEmbed // embedded structs without a json tag
}

type refEmbed struct {
	typ string // the embedded type's name
	doc string // the embedded field's godoc, one paragraph
}

// TestJSONReference generates docs/json.md from the godoc of every config
// field, and fails when the file on disk is not what it would generate.
func TestJSONReference(t *testing.T) {
	got, err := renderJSONReference()
	if err != nil {
		t.Fatal(err)
	}
	if *updateDocs {
		if err := os.WriteFile(jsonReferencePath, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", jsonReferencePath)
		return
	}
	want, err := os.ReadFile(jsonReferencePath)
	if err != nil {
		t.Fatalf("%v; run `go test -run TestJSONReference -update-docs .` to generate it", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date with the godoc of the config structs (%s); run `go test -run TestJSONReference -update-docs .` to regenerate it",
			jsonReferencePath, firstDiff(want, got))
	}
}

// TestJSONReferenceDefaults checks the documented defaults against the ones
// the code applies, where they can be applied without I/O: the handler's
// (setDefaults) and the memory store's (Provision).
func TestJSONReferenceDefaults(t *testing.T) {
	var o app.Options
	o.SetDefaults()
	checkDefaults(t, "app/options.go", "Options", &o)

	m := memory.Memory{}
	if err := m.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	checkDefaults(t, "store/memory/memory.go", "Memory", &m)
}

// checkDefaults compares each field's documented default with the value
// the code set in v: a field set to a non-zero value must document it, and
// a documented literal default must be that value.
func checkDefaults(t *testing.T, path, typ string, v any) {
	t.Helper()
	st, err := parseConfigStruct(path, typ)
	if err != nil {
		t.Fatal(err)
	}
	rv := reflect.ValueOf(v).Elem()
	for _, f := range st.fields {
		fv := rv.FieldByName(f.goName)
		if fv.IsZero() {
			continue // the code sets nothing here (or sets it elsewhere)
		}
		if f.def == "" {
			t.Errorf("%s.%s (%s): the code defaults it to %v, but its godoc has no \"Default: ...\" sentence", typ, f.goName, f.json, fv.Interface())
			continue
		}
		// The documented literal: the default's text without backquotes,
		// up to a parenthetical remark.
		lit := strings.ReplaceAll(f.def, "`", "")
		if i := strings.Index(lit, " ("); i >= 0 {
			lit = lit[:i]
		}
		var want string
		switch x := fv.Interface().(type) {
		case caddy.Duration:
			d, err := caddy.ParseDuration(lit)
			if err != nil || caddy.Duration(d) != x {
				t.Errorf("%s.%s (%s): documented default %q, the code's is %v", typ, f.goName, f.json, f.def, time.Duration(x))
			}
			continue
		case []string:
			want = strings.Join(x, ", ")
		case []int:
			want = strings.Trim(strings.Join(strings.Fields(fmt.Sprint(x)), ", "), "[]")
		default:
			want = fmt.Sprint(x)
		}
		if lit != want {
			t.Errorf("%s.%s (%s): documented default %q, the code's is %q", typ, f.goName, f.json, f.def, want)
		}
	}
}

// renderJSONReference renders docs/json.md.
func renderJSONReference() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`<!-- Code generated by TestJSONReference in docs_test.go from the godoc of the config structs. DO NOT EDIT.
     Edit the field comments in the Go source, then run: go test -run TestJSONReference -update-docs . -->

# JSON config reference

Every field of the handler, the ` + "`idempotency`" + ` app and the four stores, as
Caddy's native JSON config spells it. The descriptions are the Go doc
comments of the config structs; the Caddyfile syntax, with the same option
names, is in the [README](../README.md#configuration) and the
[store pages](stores/).

Types: a **duration** is a Go duration string such as ` + "`\"30s\"`" + `
(Caddy also accepts ` + "`d`" + ` for days) or an integer of nanoseconds; sizes
are integers of bytes. Strings that the descriptions say take placeholders
accept Caddy's global ones, such as ` + "`{env.NAME}`" + `. A field left out takes its
default; **—** means none: the field is empty. A list is left out or holds
at least one value: an empty list (` + "`[]`" + `) is a config error that names
the field, never "none of them".

`)
	for _, m := range refModules {
		fmt.Fprintf(&b, "- [%s](#%s) (`%s`)\n", m.title, m.anchor, m.id)
	}
	b.WriteString("\n")

	for _, m := range refModules {
		st, err := parseConfigStruct(m.file, m.typ)
		if err != nil {
			return nil, err
		}
		if m.flatten {
			if st, err = flattenEmbeds(st); err != nil {
				return nil, err
			}
		}
		if err := crossCheck(m, st); err != nil {
			return nil, err
		}

		fmt.Fprintf(&b, "## %s\n\n", m.title)
		fmt.Fprintf(&b, "Module ID `%s`, type `%s` in [`%s`](../%s).\n\n", m.id, m.typ, m.file, m.file)
		fmt.Fprintf(&b, "Where: %s", m.where)
		if m.page != "" {
			fmt.Fprintf(&b, " Operator's guide: [%s](%s).", strings.TrimSuffix(strings.TrimPrefix(m.page, "stores/"), ".md")+" store", m.page)
		}
		b.WriteString("\n\n")
		b.WriteString(st.doc) // ends with a blank line
		for _, e := range st.embeds {
			fmt.Fprintf(&b, "Embedded `%s`: %s\n\n", e.typ, e.doc)
			if e.typ == "app.Options" || e.typ == "Options" {
				b.WriteString("Its fields are every field of the [handler](#handler), at the top level of the app's object, with the same types and defaults.\n\n")
			} else {
				fmt.Fprintf(&b, "Its fields are those of `%s`, at the top level of this object.\n\n", e.typ)
			}
		}
		if len(st.fields) > 0 {
			b.WriteString("| JSON field | type | default | description |\n|---|---|---|---|\n")
			for _, f := range st.fields {
				def := f.def
				switch {
				case def != "":
				case f.typ == "boolean":
					def = "`false`"
				case f.typ == "integer":
					def = "`0`"
				default:
					def = "—"
				}
				fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", f.json, f.typ, cell(def), cell(f.doc))
			}
			b.WriteString("\n")
		}
	}
	return append(bytes.TrimRight(b.Bytes(), "\n"), '\n'), nil
}

// parseConfigStruct reads the struct typ declared in the Go file at path.
func parseConfigStruct(path, typ string) (*refStruct, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, spec := range gd.Specs {
			ts := spec.(*ast.TypeSpec)
			if ts.Name.Name != typ {
				continue
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return nil, fmt.Errorf("%s: %s is not a struct", path, typ)
			}
			doc := ts.Doc
			if doc == nil {
				doc = gd.Doc
			}
			if doc == nil {
				return nil, fmt.Errorf("%s: type %s has no doc comment", path, typ)
			}
			typeDoc, err := markdown(doc.Text())
			if err != nil {
				return nil, fmt.Errorf("%s: type %s: %w", path, typ, err)
			}
			out := &refStruct{doc: typeDoc}
			for _, field := range st.Fields.List {
				if err := addField(out, fset, path, typ, field); err != nil {
					return nil, err
				}
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("%s: no type %s", path, typ)
}

func addField(out *refStruct, fset *token.FileSet, path, typ string, field *ast.Field) error {
	pos := fset.Position(field.Pos())
	var tag reflect.StructTag
	if field.Tag != nil {
		s, err := strconv.Unquote(field.Tag.Value)
		if err != nil {
			return fmt.Errorf("%s: bad tag: %w", pos, err)
		}
		tag = reflect.StructTag(s)
	}
	jsonName, hasTag := tag.Lookup("json")
	jsonName, _, _ = strings.Cut(jsonName, ",")
	if jsonName == "-" {
		return nil
	}
	doc := ""
	if field.Doc != nil {
		doc = oneParagraph(field.Doc.Text())
	}

	if len(field.Names) == 0 { // embedded
		name := typeString(field.Type)
		if !ast.IsExported(name[strings.LastIndexAny(name, "*.")+1:]) || hasTag {
			if hasTag {
				return fmt.Errorf("%s: %s: embedded %s with a json tag is not supported by the generator", pos, typ, name)
			}
			return nil
		}
		if doc == "" {
			return fmt.Errorf("%s: %s: embedded %s has no doc comment; every config field needs one, it is the JSON reference's description", pos, typ, name)
		}
		out.embeds = append(out.embeds, refEmbed{typ: name, doc: doc})
		return nil
	}
	for _, n := range field.Names {
		if !n.IsExported() {
			continue
		}
		if !hasTag || jsonName == "" {
			return fmt.Errorf("%s: %s.%s is exported but has no json tag name; give it one, or `json:\"-\"`", pos, typ, n.Name)
		}
		if doc == "" {
			return fmt.Errorf("%s: %s.%s (json %q) has no doc comment; every config field needs one, it is the JSON reference's description", pos, typ, n.Name, jsonName)
		}
		jt, err := jsonType(field.Type, tag)
		if err != nil {
			return fmt.Errorf("%s: %s.%s: %w", pos, typ, n.Name, err)
		}
		desc, def := splitDefault(doc)
		out.fields = append(out.fields, refField{
			goName: n.Name,
			json:   jsonName,
			typ:    jt,
			def:    def,
			doc:    desc,
		})
	}
	return nil
}

// jsonType renders a field's Go type as the JSON type a config author
// writes. Unknown types are an error, so that a new one gets a name here.
func jsonType(expr ast.Expr, tag reflect.StructTag) (string, error) {
	switch s := typeString(expr); s {
	case "string":
		return "string", nil
	case "bool", "*bool":
		return "boolean", nil
	case "int", "int32", "int64", "uint", "uint32", "uint64":
		return "integer", nil
	case "[]string":
		return "array of strings", nil
	case "[]int":
		return "array of integers", nil
	case "caddy.Duration":
		return "duration", nil
	case "*KeyFrom":
		return "object: `{\"query\": <name>}` or `{\"json\": <pointer>}`", nil
	case "json.RawMessage":
		ns := ""
		for _, kv := range strings.Fields(tag.Get("caddy")) {
			if v, ok := strings.CutPrefix(kv, "namespace="); ok {
				ns = v
			}
		}
		switch ns {
		case "":
			return "", fmt.Errorf("json.RawMessage without a caddy namespace tag")
		case "http.idempotency.stores":
			return "store module object", nil
		default:
			return fmt.Sprintf("module object (`%s`)", ns), nil
		}
	default:
		return "", fmt.Errorf("no JSON type name for Go type %s; add one to jsonType in docs_test.go", s)
	}
}

func typeString(expr ast.Expr) string {
	switch e := expr.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return typeString(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + typeString(e.X)
	case *ast.ArrayType:
		if e.Len == nil {
			return "[]" + typeString(e.Elt)
		}
	case *ast.MapType:
		return "map[" + typeString(e.Key) + "]" + typeString(e.Value)
	}
	return fmt.Sprintf("%T", expr)
}

// defaultSentence matches "Default: X." up to the period that ends the
// sentence (followed by a space or the end), so that "127.0.0.1:6379" stays
// whole.
var defaultSentence = regexp.MustCompile(`(?:^|\s)Default: (.+?)\.(?:\s|$)`)

// requiredSentence matches a "Required." sentence.
var requiredSentence = regexp.MustCompile(`(?:^|\s)Required\.(?:\s|$)`)

// splitDefault pulls the "Default: X." (or "Required.") sentence out of a
// field's doc.
func splitDefault(doc string) (desc, def string) {
	if m := defaultSentence.FindStringSubmatchIndex(doc); m != nil {
		def = doc[m[2]:m[3]]
		desc = strings.TrimSpace(doc[:m[0]] + " " + doc[m[1]:])
		return desc, literal(def)
	}
	if m := requiredSentence.FindStringIndex(doc); m != nil {
		return strings.TrimSpace(doc[:m[0]] + " " + doc[m[1]:]), "required"
	}
	return doc, ""
}

// literal sets the value part of a default in code: a single token (or a
// placeholder template, which may hold spaces), a token followed by a
// parenthetical remark, or a comma-separated list of tokens. Prose ("the
// idempotency directory in ...") stays as written.
func literal(def string) string {
	token := func(s string) bool {
		template := strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}")
		return s != "" && !strings.Contains(s, "`") && (template || !strings.Contains(s, " "))
	}
	if token(def) {
		return "`" + def + "`"
	}
	if head, rest, ok := strings.Cut(def, " ("); ok && token(head) && strings.HasSuffix(rest, ")") {
		return "`" + head + "` (" + rest
	}
	parts := strings.Split(def, ", ")
	for _, p := range parts {
		if !token(p) || strings.ToUpper(p) != p { // lists are of constants such as POST
			return def
		}
	}
	return "`" + strings.Join(parts, "`, `") + "`"
}

// oneParagraph joins a comment's lines into one paragraph.
func oneParagraph(text string) string {
	return strings.Join(strings.Fields(text), " ")
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}

// markdown renders a type's doc comment: paragraphs joined into lines, code
// blocks fenced.
func markdown(text string) (string, error) {
	var p comment.Parser
	doc := p.Parse(text)
	var b strings.Builder
	for _, block := range doc.Content {
		switch blk := block.(type) {
		case *comment.Paragraph:
			b.WriteString(commentText(blk.Text))
			b.WriteString("\n\n")
		case *comment.Code:
			b.WriteString("```\n")
			b.WriteString(blk.Text)
			b.WriteString("```\n\n")
		default:
			return "", fmt.Errorf("doc comment block %T is not supported by the generator", block)
		}
	}
	return b.String(), nil
}

func commentText(texts []comment.Text) string {
	var b strings.Builder
	for _, t := range texts {
		switch x := t.(type) {
		case comment.Plain:
			b.WriteString(string(x))
		case comment.Italic:
			b.WriteString("_" + string(x) + "_")
		case *comment.Link:
			b.WriteString(commentText(x.Text))
		case *comment.DocLink:
			b.WriteString("`" + commentText(x.Text) + "`")
		}
	}
	return oneParagraph(b.String())
}

// flattenEmbeds lists the fields of st's embedded Options as st's own,
// where they are: the handler's options are the handler's JSON fields.
func flattenEmbeds(st *refStruct) (*refStruct, error) {
	flat := &refStruct{doc: st.doc}
	for _, e := range st.embeds {
		if e.typ != "app.Options" && e.typ != "Options" {
			return nil, fmt.Errorf("flattening embedded %s is not supported by the generator", e.typ)
		}
		os, err := parseConfigStruct("app/options.go", "Options")
		if err != nil {
			return nil, err
		}
		flat.fields = append(flat.fields, os.fields...)
	}
	flat.fields = append(flat.fields, st.fields...)
	return flat, nil
}

// crossCheck compares the parsed JSON fields with what encoding/json sees
// in the compiled struct, and the module ID with Caddy's registry, so that
// the generator cannot read the wrong file or type.
func crossCheck(m refModule, st *refStruct) error {
	info, err := caddy.GetModule(m.id)
	if err != nil {
		return fmt.Errorf("%s: %w", m.id, err)
	}
	if got, want := reflect.TypeOf(info.New()).Elem(), reflect.TypeOf(m.value); got != want {
		return fmt.Errorf("module %s is %v, the reference documents %v", m.id, got, want)
	}
	var parsed []string
	for _, e := range st.embeds {
		if e.typ == "app.Options" || e.typ == "Options" {
			hs, err := parseConfigStruct("app/options.go", "Options")
			if err != nil {
				return err
			}
			for _, f := range hs.fields {
				parsed = append(parsed, f.json)
			}
		}
	}
	for _, f := range st.fields {
		parsed = append(parsed, f.json)
	}
	compiled := jsonNames(reflect.TypeOf(m.value))
	if strings.Join(parsed, ",") != strings.Join(compiled, ",") {
		return fmt.Errorf("%s: the fields parsed from %s (%v) differ from the compiled %v's JSON fields (%v)",
			m.id, m.file, parsed, reflect.TypeOf(m.value), compiled)
	}
	// The JSON names must round-trip through encoding/json.
	if _, err := json.Marshal(m.value); err != nil {
		return fmt.Errorf("%s: %w", m.id, err)
	}
	return nil
}

// jsonNames lists the JSON field names of t as encoding/json sees them
// (embedded untagged structs flattened).
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, hasTag := f.Tag.Lookup("json")
		name, _, _ = strings.Cut(name, ",")
		switch {
		case name == "-":
		case f.Anonymous && !hasTag && f.Type.Kind() == reflect.Struct:
			names = append(names, jsonNames(f.Type)...)
		case !f.IsExported():
		case name == "":
			names = append(names, f.Name)
		default:
			names = append(names, name)
		}
	}
	return names
}

// firstDiff describes the first line where got differs from want.
func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("first difference at line %d: on disk %q, generated %q", i+1, w, g)
		}
	}
	return "no line differs"
}
