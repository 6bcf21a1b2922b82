package e2e

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver takes the spans that Caddy's exporter sends over OTLP/HTTP
// (protobuf, POST /v1/traces), as a collector would.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t testing.TB) *otlpReceiver {
	o := &otlpReceiver{}
	o.srv = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *otlpReceiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			o.spans = append(o.spans, ss.GetSpans()...)
		}
	}
	o.mu.Unlock()
	resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(resp)
}

// received returns the spans received so far.
func (o *otlpReceiver) received() []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*tracepb.Span(nil), o.spans...)
}

// children returns the received spans whose parent is parent, by name.
func children(spans []*tracepb.Span, parent *tracepb.Span) map[string][]*tracepb.Span {
	out := map[string][]*tracepb.Span{}
	for _, s := range spans {
		if bytes.Equal(s.GetTraceId(), parent.GetTraceId()) && bytes.Equal(s.GetParentSpanId(), parent.GetSpanId()) {
			out[s.GetName()] = append(out[s.GetName()], s)
		}
	}
	return out
}

func spanAttrs(s *tracepb.Span) map[string]string {
	out := map[string]string{}
	for _, kv := range s.GetAttributes() {
		out[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	return out
}

// Under Caddy's tracing directive, the built binary exports the store calls
// as children of Caddy's server span, through the exporter Caddy configures
// from OTEL_EXPORTER_OTLP_*, with the store's name and without the key.
func TestTracing(t *testing.T) {
	t.Parallel()
	otlp := startOTLPReceiver(t)
	u := startUpstream(t)
	site := "tracing {\n\tspan idempotency-e2e\n}\n" + proxySite(u, "store memory {\n\tname \"traced orders\"\n}")
	c := startCaddyEnv(t, "caddy", site, []string{
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.srv.URL,
		"OTEL_BSP_SCHEDULE_DELAY=100",
	})
	cl := newClient(t)
	const key, body = "trace-e2e-5b1d", `{"card":"4242-e2e"}`
	first := send(t, cl, req(http.MethodPost, c.URL+"/orders", key, []byte(body)))
	wantStatus(t, "first request", first, http.StatusCreated)
	replay := send(t, cl, req(http.MethodPost, c.URL+"/orders", key, []byte(body)))
	wantReplay(t, "retry", first, replay)

	// The two server spans, each with its store calls.
	var servers []*tracepb.Span
	var spans []*tracepb.Span
	if !eventually(15*time.Second, 50*time.Millisecond, func() bool {
		spans = otlp.received()
		servers = servers[:0]
		for _, s := range spans {
			if s.GetName() == "idempotency-e2e" && s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
				servers = append(servers, s)
			}
		}
		return len(servers) == 2 && len(children(spans, servers[0]))+len(children(spans, servers[1])) == 3
	}) {
		t.Fatalf("received %d spans, %d server spans; want 2 server spans and 3 store calls:\n%v", len(spans), len(servers), spans)
	}
	if servers[0].GetStartTimeUnixNano() > servers[1].GetStartTimeUnixNano() {
		servers[0], servers[1] = servers[1], servers[0]
	}
	for i, want := range []map[string]map[string]string{
		{"idempotency.acquire": {"idempotency.state": "new", "idempotency.result": "ok"}, "idempotency.complete": {"idempotency.result": "ok"}},
		{"idempotency.acquire": {"idempotency.state": "completed", "idempotency.result": "ok"}},
	} {
		got := children(spans, servers[i])
		if len(got) != len(want) {
			t.Errorf("request %d: store spans %v, want %v", i+1, got, want)
		}
		for name, attrs := range want {
			if len(got[name]) != 1 {
				t.Errorf("request %d: %d %s spans, want 1", i+1, len(got[name]), name)
				continue
			}
			have := spanAttrs(got[name][0])
			attrs["idempotency.store"], attrs["idempotency.store.module"] = "traced orders", "memory"
			for k, v := range attrs {
				if have[k] != v {
					t.Errorf("request %d: %s has %s = %q, want %q (attributes %v)", i+1, name, k, have[k], v, have)
				}
			}
		}
	}
	for _, s := range spans {
		for _, kv := range s.GetAttributes() {
			if v := kv.GetValue().String(); strings.Contains(v, key) || strings.Contains(v, "4242") {
				t.Errorf("span %s: attribute %s = %s holds the key or the body", s.GetName(), kv.GetKey(), v)
			}
		}
	}
}
