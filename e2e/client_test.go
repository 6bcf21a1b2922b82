package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// response is a whole HTTP answer as the client got it.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string {
	body := string(r.Body)
	if len(body) > 300 {
		body = body[:300] + fmt.Sprintf("...(%d bytes)", len(r.Body))
	}
	return fmt.Sprintf("%d %v %s", r.Status, r.Header, body)
}

func (r response) replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// newClient is an HTTP client that shows responses as sent (no transparent
// gzip, no proxy from the environment).
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 100,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// freshClient opens a new connection for every request, so that each one
// reaches the configuration Caddy runs at that moment.
func freshClient(t testing.TB) *http.Client {
	c := newClient(t)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	return c
}

// req builds a request; key "" sends no Idempotency-Key, and hdr holds
// further header name, value pairs.
func req(method, url, key string, body []byte, hdr ...string) *http.Request {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		panic(err)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			r.Host = hdr[i+1]
			continue
		}
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return r
}

// do sends r and reads the whole answer; it is safe in any goroutine.
func do(c *http.Client, r *http.Request) (response, error) {
	res, err := c.Do(r)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, fmt.Errorf("reading the body of %s %s: %w", r.Method, r.URL, err)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: body}, nil
}

// send is do for the test goroutine: it fails the test on a transport error.
func send(t testing.TB, c *http.Client, r *http.Request) response {
	t.Helper()
	res, err := do(c, r)
	if err != nil {
		t.Fatalf("%s %s: %v", r.Method, r.URL, err)
	}
	return res
}

func wantStatus(t testing.TB, what string, r response, status int) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: got %s, want status %d", what, r, status)
	}
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// problemAnchor returns the anchor of the problem type of r ("outstanding",
// "key-reused", ...), or "" if r is not a problem answer.
func problemAnchor(r response) string {
	if r.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p problemBody
	if json.Unmarshal(r.Body, &p) != nil {
		return ""
	}
	_, anchor, _ := strings.Cut(p.Type, "#")
	return anchor
}

// wantProblem checks that r is an RFC 9457 problem with status and the
// documented type anchor, and with Retry-After when retryAfter.
func wantProblem(t testing.TB, what string, r response, status int, anchor string, retryAfter bool) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: got %s, want a %d problem", what, r, status)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q, want application/problem+json; answer %s", what, ct, r)
	}
	var p problemBody
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("%s: problem body is not JSON: %v; answer %s", what, err, r)
	}
	if p.Status != status || !strings.HasSuffix(p.Type, "#"+anchor) || p.Title == "" {
		t.Fatalf("%s: problem %+v, want status %d and a type ending in #%s", what, p, status, anchor)
	}
	if ra := r.Header.Get("Retry-After"); retryAfter && ra == "" {
		t.Fatalf("%s: no Retry-After on %s", what, r)
	} else if !retryAfter && ra != "" {
		t.Fatalf("%s: unexpected Retry-After %q on %s", what, ra, r)
	}
	if r.replayed() {
		t.Fatalf("%s: a refusal is marked as replayed: %s", what, r)
	}
}

// wantReplay checks that replay repeats first byte for byte, marked as a
// replay, without the first caller's cookies.
func wantReplay(t testing.TB, what string, first, replay response) {
	t.Helper()
	if !replay.replayed() {
		t.Fatalf("%s: no Idempotent-Replayed: true on %s", what, replay)
	}
	if replay.Status != first.Status {
		t.Fatalf("%s: replay status %d, first answer %d", what, replay.Status, first.Status)
	}
	if !bytes.Equal(replay.Body, first.Body) {
		t.Fatalf("%s: replay body differs from the first answer:\n first  %q\n replay %q", what, first.Body, replay.Body)
	}
	for name, values := range first.Header {
		switch name {
		case "Date", "Set-Cookie":
			continue // per response, per caller
		}
		if !slices.Equal(values, replay.Header[name]) {
			t.Fatalf("%s: replay %s %q, first answer %q", what, name, replay.Header[name], values)
		}
	}
	if c := replay.Header.Values("Set-Cookie"); len(c) > 0 {
		t.Fatalf("%s: replay carries the first caller's cookies %q", what, c)
	}
}

// retryUntilSettled resends the request made by mk while it gets 409
// "outstanding", as a client honouring Retry-After would (but faster), and
// returns the first other answer and how many 409s came before it.
func retryUntilSettled(t testing.TB, c *http.Client, mk func() *http.Request, timeout time.Duration) (response, int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	conflicts := 0
	for {
		r := send(t, c, mk())
		if r.Status != http.StatusConflict || problemAnchor(r) != "outstanding" {
			return r, conflicts
		}
		conflicts++
		if time.Now().After(deadline) {
			t.Fatalf("still 409 outstanding after %v (%d tries): %s", timeout, conflicts, r)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// eventually polls cond every interval until it holds or timeout passes.
func eventually(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

func wantCount(t testing.TB, what string, got, want int) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: %d, want %d", what, got, want)
	}
}
