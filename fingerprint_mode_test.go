package idempotency

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
)

// sameOrNot is one request sent after a first one with the same key: the
// retry that must replay, or the other payload that must get 422.
type sameOrNot struct {
	name, path, body string
	header           http.Header
	replay           bool
}

// sendAfterFirst sends first, then each case with the first's key, and
// checks the answers and that the backend ran once.
func sendAfterFirst(t *testing.T, h *Handler, first sameOrNot, cases []sameOrNot) {
	t.Helper()
	b := &backend{}
	send := func(c sameOrNot) response {
		req := post(c.path, "k", c.body)
		for name, lines := range c.header {
			req.Header[name] = lines
		}
		return do(h, b, req)
	}
	wantStatus(t, send(first), 201)
	for _, c := range cases {
		r := send(c)
		switch res := r.placeholder("http.idempotency.result"); {
		case c.replay && (r.Code != 201 || res != "replay"):
			t.Errorf("%s: %d %s, want a replay", c.name, r.Code, res)
		case !c.replay && (r.Code != 422 || res != "mismatch"):
			t.Errorf("%s: %d %s, want 422", c.name, r.Code, res)
		}
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("backend ran %d times, want 1", n)
	}
}

func TestFingerprintJSON(t *testing.T) {
	first := sameOrNot{path: "/orders?b=2&a=1&a=x", body: `{"sku":"tea","qty":1,"price":1.0,"n":1e2,"name":"café","tags":["a","b"],"meta":{"region":"eu"}}`}
	cases := []sameOrNot{
		{"members reordered", "/orders?b=2&a=1&a=x", `{"meta":{"region":"eu"},"tags":["a","b"],"name":"café","n":1e2,"price":1.0,"qty":1,"sku":"tea"}`, nil, true},
		{"whitespace", "/orders?b=2&a=1&a=x", "{ \"sku\" : \"tea\",\n\t\"qty\": 1, \"price\": 1.0, \"n\": 1e2, \"name\": \"café\", \"tags\": [ \"a\", \"b\" ], \"meta\": { \"region\": \"eu\" } }\n", nil, true},
		{"escapes", "/orders?b=2&a=1&a=x", `{"sku":"t\u0065a","qty":1,"price":1.0,"n":1e2,"name":"caf\u00e9","tags":["\u0061","b"],"meta":{"region":"eu"}}`, nil, true},
		{"1 for 1.0, 100 for 1e2", "/orders?b=2&a=1&a=x", `{"sku":"tea","qty":1.00,"price":1,"n":100,"name":"café","tags":["a","b"],"meta":{"region":"eu"}}`, nil, true},
		{"query sorted", "/orders?a=1&a=x&b=2", first.body, nil, true},
		{"query escaped", "/orders?%61=%31&a=x&b=2", first.body, nil, true},
		{"a value changed", "/orders?b=2&a=1&a=x", strings.Replace(first.body, `"qty":1`, `"qty":2`, 1), nil, false},
		{"a nested value changed", "/orders?b=2&a=1&a=x", strings.Replace(first.body, `"eu"`, `"us"`, 1), nil, false},
		{"array reordered", "/orders?b=2&a=1&a=x", strings.Replace(first.body, `["a","b"]`, `["b","a"]`, 1), nil, false},
		{"a member added", "/orders?b=2&a=1&a=x", strings.Replace(first.body, `{"sku"`, `{"gift":false,"sku"`, 1), nil, false},
		{"a string for a number", "/orders?b=2&a=1&a=x", strings.Replace(first.body, `"qty":1`, `"qty":"1"`, 1), nil, false},
		{"repeated values reordered", "/orders?b=2&a=x&a=1", first.body, nil, false},
		{"a query value changed", "/orders?b=3&a=1&a=x", first.body, nil, false},
		{"no query", "/orders", first.body, nil, false},
	}
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.Fingerprint = "json" })
		sendAfterFirst(t, h, first, cases)
	})
}

// A fresh timestamp or trace id, wherever the pointers say, is still the
// same payload; any other change is not.
func TestFingerprintIgnore(t *testing.T) {
	first := sameOrNot{path: "/orders", body: `{"sku":"tea","sent_at":"10:00","meta":{"trace_id":"t1","region":"eu"},"items":[{"id":1,"client_ts":1},{"id":2,"client_ts":2}]}`}
	fresh := `{"sku":"tea","sent_at":"10:05","meta":{"trace_id":"t2","region":"eu"},"items":[{"id":1,"client_ts":9},{"id":2,"client_ts":8}]}`
	cases := []sameOrNot{
		{"fresh timestamp and trace ids", "/orders", fresh, nil, true},
		{"ignored members left out", "/orders", `{"sku":"tea","meta":{"region":"eu"},"items":[{"id":1},{"id":2}]}`, nil, true},
		{"another value", "/orders", strings.Replace(fresh, `"tea"`, `"coffee"`, 1), nil, false},
		{"a sibling of an ignored member", "/orders", strings.Replace(fresh, `"eu"`, `"us"`, 1), nil, false},
		{"a sibling in an array element", "/orders", strings.Replace(fresh, `"id":2`, `"id":3`, 1), nil, false},
		{"an element dropped", "/orders", `{"sku":"tea","sent_at":"1","meta":{"trace_id":"t","region":"eu"},"items":[{"id":1,"client_ts":1}]}`, nil, false},
	}
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) {
			h.Fingerprint = "json"
			h.FingerprintIgnore = []string{"/sent_at", "/meta/trace_id", "/items/*/client_ts"}
		})
		sendAfterFirst(t, h, first, cases)
	})
}

// A body that is not JSON is fingerprinted as its bytes and passed on:
// whether it is valid is the upstream's business.
func TestFingerprintJSONFallsBackToBytes(t *testing.T) {
	first := sameOrNot{path: "/orders", body: `{"sku": tea}`}
	cases := []sameOrNot{
		{"the same bytes", "/orders", `{"sku": tea}`, nil, true},
		{"other whitespace", "/orders", `{"sku":tea}`, nil, false},
		{"valid JSON", "/orders", `{"sku":"tea"}`, nil, false},
	}
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.Fingerprint = "json" })
		sendAfterFirst(t, h, first, cases)
	})
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.Fingerprint = "json" })
	b := &backend{}
	for i, body := range []string{"", "not json", `{"a":1}{"b":2}`, "{\"a\":\"\xff\"}"} {
		wantStatus(t, do(h, b, post("/p", "k"+itoa(int64(i)), body)), 201)
		if got := b.bodies[len(b.bodies)-1]; string(got) != body {
			t.Errorf("upstream got %q, want %q", got, body)
		}
	}
}

// Raw bytes that spell another body's canonical form, or a query's decoded
// parameters, are not that body or query.
func TestFingerprintJSONDomainSeparated(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.Fingerprint = "json" })
	fp := func(target, body string) any {
		req := post(target, "k", body)
		return h.payload.Of(req, []byte(body))
	}
	canon, ok := canonjson.Append(nil, []byte(`{"a":1}`), nil)
	if !ok {
		t.Fatal("not JSON")
	}
	if fp("/p", `{"a":1}`) == fp("/p", string(canon)) {
		t.Error("a body's canonical form, sent as bytes, has the body's fingerprint")
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"/p?a=%zz", "/p?a=%25zz", false}, // kept raw, and the decoded spelling of the raw
		{"/p?a=1&b=2", "/p?a=1%26b%3D2", false},
		{"/p?a=%zz", "/p?a=%zz", true},
		{"/p?q=a+b", "/p?q=a%20b", true},
		{"/p?a", "/p?a=&", true},
		{"/p?a=1&&b=2", "/p?b=2&a=1", true},
		{"/p?ab=1", "/p?a=b1", false},
	} {
		if (fp(c.a, "{}") == fp(c.b, "{}")) != c.same {
			t.Errorf("%s and %s: same fingerprint %v, want %v", c.a, c.b, !c.same, c.same)
		}
	}
	if fp("/p", "{}") == fp("/p", "") {
		t.Error("an empty body has the fingerprint of {}")
	}
}

// onceBody is a request body that records whether it was read.
type onceBody struct {
	io.Reader
	read bool
}

func (b *onceBody) Read(p []byte) (int, error) { b.read = true; return b.Reader.Read(p) }
func (*onceBody) Close() error                 { return nil }

// fingerprint none: another body is a retry, the body reaches the upstream
// unread and unbuffered, and max_request_body does not apply.
func TestFingerprintNone(t *testing.T) {
	first := sameOrNot{path: "/orders?a=1", body: `{"sku":"tea"}`}
	cases := []sameOrNot{
		{"another body", "/orders?a=1", `{"sku":"coffee"}`, nil, true},
		{"another query", "/orders?a=2", "not even json", nil, true},
	}
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		h := provision(t, raw, func(h *Handler) { h.Fingerprint = "none" })
		sendAfterFirst(t, h, first, cases)
	})

	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) {
		h.Fingerprint = "none"
		h.MaxRequestBody = 10
	})
	large := bytes.Repeat([]byte("0123456789"), 1000)
	for _, length := range []int64{int64(len(large)), -1} {
		body := &onceBody{Reader: bytes.NewReader(large)}
		req := post("/p", "big"+itoa(length), "")
		req.Body, req.ContentLength = body, length
		var got []byte
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if r.Body != io.ReadCloser(body) || body.read {
				t.Errorf("length %d: the body was read or replaced before the upstream", length)
			}
			got, _ = io.ReadAll(r.Body)
			w.WriteHeader(201)
			return nil
		})
		wantStatus(t, do(h, next, req), 201)
		if !bytes.Equal(got, large) {
			t.Errorf("length %d: upstream got %d bytes, not the %d sent", length, len(got), len(large))
		}
	}
}

// fingerprint_headers count in every mode: the same body for another
// account is another payload.
func TestFingerprintHeaders(t *testing.T) {
	first := sameOrNot{path: "/orders", body: `{"sku":"tea"}`, header: http.Header{
		"X-Account-Id": {"acme"}, "Content-Type": {"application/json"}, "X-Tag": {"a", "b"}}}
	with := func(name string, lines ...string) http.Header {
		h := first.header.Clone()
		h[name] = lines
		if lines == nil {
			delete(h, name)
		}
		return h
	}
	cases := []sameOrNot{
		{"the same headers", "/orders", first.body, with("X-Other", "1"), true},
		{"another account", "/orders", first.body, with("X-Account-Id", "globex"), false},
		{"another content type", "/orders", first.body, with("Content-Type", "text/plain"), false},
		{"lines reordered", "/orders", first.body, with("X-Tag", "b", "a"), false},
		{"absent", "/orders", first.body, with("X-Account-Id"), false},
		{"empty", "/orders", first.body, with("X-Account-Id", ""), false},
	}
	for _, mode := range []string{"body", "json", "none"} {
		t.Run(mode, func(t *testing.T) {
			eachStore(t, func(t *testing.T, raw json.RawMessage) {
				h := provision(t, raw, func(h *Handler) {
					h.Fingerprint = mode
					h.FingerprintHeaders = []string{"x-account-id", "Content-Type", "X-TAG", "X-Account-Id"}
				})
				sendAfterFirst(t, h, first, cases)
			})
		})
	}
	// An absent header and an empty one differ however the first came.
	h := provision(t, storeConfigs[0].raw(t), func(h *Handler) { h.FingerprintHeaders = []string{"X-Account-Id"} })
	sendAfterFirst(t, h, sameOrNot{path: "/p", body: "x"}, []sameOrNot{
		{"empty", "/p", "x", http.Header{"X-Account-Id": {""}}, false},
		{"absent", "/p", "x", nil, true},
	})
}
