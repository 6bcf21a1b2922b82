package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Request headers that tell the upstream how to answer. Lists separated by
// commas are indexed by the run number of the request's key (its 1st, 2nd,
// ... start); the last element holds for later runs. Headers are not part
// of the idempotency fingerprint, and a retry sends the same ones.
const (
	hdrDelay     = "X-Upstream-Delay"     // durations: wait before answering
	hdrStatus    = "X-Upstream-Status"    // status codes; default 201
	hdrSize      = "X-Upstream-Size"      // answer this many bytes of pattern() instead of JSON
	hdrStream    = "X-Upstream-Stream"    // "1": two flushed chunks, streamGap apart
	hdrCookie    = "X-Upstream-Cookie"    // "1": set a session cookie
	hdrGate      = "X-Upstream-Gate"      // "1": wait until the test opens the gate
	hdrHangUp    = "X-Upstream-Hangup"    // "1": close the connection without an answer
	hdrRun       = "X-Upstream-Run"       // response: the run number
	streamGap    = 500 * time.Millisecond // between the chunks of a streamed answer
	firstChunk   = "first chunk\n"
	secondChunk  = "second chunk\n"
	maxUpstreamW = 30 * time.Second // no upstream request waits longer than this
)

// upstream is the application behind reverse_proxy. It counts, per
// Idempotency-Key, how many requests started, completed, and saw their
// request context cancelled.
type upstream struct {
	srv *httptest.Server
	URL string // http://127.0.0.1:port

	gateOnce sync.Once
	gate     chan struct{}
	closing  chan struct{}

	mu   sync.Mutex
	keys map[string]*keyStats
}

type keyStats struct {
	starts, completions, cancelled int
	bodies                         [][]byte   // request bodies, per run
	transferEncodings              [][]string // request transfer codings, per run
	sent                           [][]byte   // response bodies written, per run
	secondChunkWritten             bool       // a streamed answer started its second chunk
	started                        chan struct{}
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	return startUpstreamOn(t, nil)
}

// startUpstreamOn starts the upstream on l, or on a port of its own if l is
// nil.
func startUpstreamOn(t testing.TB, l net.Listener) *upstream {
	t.Helper()
	u := &upstream{
		gate:    make(chan struct{}),
		closing: make(chan struct{}),
		keys:    make(map[string]*keyStats),
	}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	if l != nil {
		u.srv.Listener.Close()
		u.srv.Listener = l
	}
	u.srv.Start()
	u.URL = u.srv.URL
	t.Cleanup(func() {
		close(u.closing) // frees handlers still waiting
		u.srv.Close()
	})
	return u
}

// host is the upstream's host:port, for reverse_proxy.
func (u *upstream) host() string { return strings.TrimPrefix(u.URL, "http://") }

// openGate releases the requests waiting with X-Upstream-Gate.
func (u *upstream) openGate() { u.gateOnce.Do(func() { close(u.gate) }) }

func (u *upstream) statsLocked(key string) *keyStats {
	s := u.keys[key]
	if s == nil {
		s = &keyStats{started: make(chan struct{})}
		u.keys[key] = s
	}
	return s
}

func (u *upstream) read(key string, f func(s *keyStats)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(u.statsLocked(key))
}

func (u *upstream) starts(key string) (n int) {
	u.read(key, func(s *keyStats) { n = s.starts })
	return n
}

func (u *upstream) completions(key string) (n int) {
	u.read(key, func(s *keyStats) { n = s.completions })
	return n
}

func (u *upstream) cancelled(key string) (n int) {
	u.read(key, func(s *keyStats) { n = s.cancelled })
	return n
}

// sentBody is the response body the upstream wrote on run n (1-based).
func (u *upstream) sentBody(key string, run int) (b []byte) {
	u.read(key, func(s *keyStats) {
		if run <= len(s.sent) {
			b = s.sent[run-1]
		}
	})
	return b
}

// receivedBody is the request body the upstream read on run n (1-based).
func (u *upstream) receivedBody(key string, run int) (b []byte, te []string) {
	u.read(key, func(s *keyStats) {
		if run <= len(s.bodies) {
			b, te = s.bodies[run-1], s.transferEncodings[run-1]
		}
	})
	return b, te
}

// startedCh is closed when the first request with key starts.
func (u *upstream) startedCh(key string) (ch chan struct{}) {
	u.read(key, func(s *keyStats) { ch = s.started })
	return ch
}

func (u *upstream) secondChunkWritten(key string) (b bool) {
	u.read(key, func(s *keyStats) { b = s.secondChunkWritten })
	return b
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	s := u.statsLocked(key)
	s.starts++
	run := s.starts
	s.bodies = append(s.bodies, body)
	s.transferEncodings = append(s.transferEncodings, r.TransferEncoding)
	if run == 1 {
		close(s.started)
	}
	u.mu.Unlock()

	if pick(r.Header.Get(hdrHangUp), run) == "1" {
		// The request arrived whole; the answer never leaves.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.Close()
		return
	}

	if !u.wait(r, run) {
		u.mu.Lock()
		s.cancelled++
		u.mu.Unlock()
		return
	}

	status := 201
	if v := pick(r.Header.Get(hdrStatus), run); v != "" {
		status, _ = strconv.Atoi(v)
	}
	h := w.Header()
	h.Set(hdrRun, strconv.Itoa(run))
	if r.Header.Get(hdrCookie) == "1" {
		h.Add("Set-Cookie", "session="+randomHex(8)+"; Path=/; HttpOnly")
	}
	var sent []byte
	switch {
	case r.Header.Get(hdrStream) == "1":
		h.Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		io.WriteString(w, firstChunk)
		http.NewResponseController(w).Flush()
		select {
		case <-time.After(streamGap):
		case <-u.closing:
		}
		u.mu.Lock()
		s.secondChunkWritten = true
		u.mu.Unlock()
		io.WriteString(w, secondChunk)
		sent = []byte(firstChunk + secondChunk)
	case r.Header.Get(hdrSize) != "":
		n, _ := strconv.Atoi(r.Header.Get(hdrSize))
		sent = pattern(n)
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(status)
		w.Write(sent)
	default:
		sum := sha256.Sum256(body)
		sent, _ = json.Marshal(map[string]any{
			"key":         key,
			"run":         run,
			"id":          randomHex(16), // differs on every run: a replay is recognisable
			"method":      r.Method,
			"path":        r.URL.Path,
			"body_sha256": hex.EncodeToString(sum[:]),
		})
		h.Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(sent)
	}
	ctxErr := r.Context().Err()
	u.mu.Lock()
	s.sent = append(s.sent, sent)
	if ctxErr != nil {
		s.cancelled++
	} else {
		s.completions++
	}
	u.mu.Unlock()
}

// wait delays the answer as the request asks, and reports false if the
// request's context was cancelled meanwhile.
func (u *upstream) wait(r *http.Request, run int) bool {
	var timer <-chan time.Time
	if d := pick(r.Header.Get(hdrDelay), run); d != "" {
		dur, err := time.ParseDuration(d)
		if err != nil {
			panic(fmt.Sprintf("bad %s %q", hdrDelay, d))
		}
		timer = time.After(dur)
	}
	gate := u.gate
	if r.Header.Get(hdrGate) != "1" {
		gate = nil
	}
	if timer == nil && gate == nil {
		return r.Context().Err() == nil
	}
	limit := time.After(maxUpstreamW)
	for timer != nil || gate != nil {
		select {
		case <-timer:
			timer = nil
		case <-gate:
			gate = nil
		case <-r.Context().Done():
			return false
		case <-u.closing:
			return false
		case <-limit:
			return false
		}
	}
	return r.Context().Err() == nil
}

// pick returns element run (1-based) of a comma-separated list, or its last
// element for later runs.
func pick(list string, run int) string {
	if list == "" {
		return ""
	}
	parts := strings.Split(list, ",")
	return strings.TrimSpace(parts[min(run, len(parts))-1])
}

// pattern is n deterministic bytes that are not all alike.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
