package idempotency

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/klauspost/compress/zstd"
)

// detailsBody is long enough for encode to compress it (its minimum is
// 512 bytes).
var detailsBody = "order 7: " + strings.Repeat("tea, ", 400)

// detailsUpstream answers by path: its own headers, compressed bodies,
// trailers and a protocol switch.
func detailsUpstream(t *testing.T, upgrades *atomic.Int64) *httptest.Server {
	unknownCoding := make([]byte, 600)
	rand.Read(unknownCoding)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		accept := r.Header.Get("Accept-Encoding")
		switch r.URL.Path {
		case "/headers":
			w.Header().Set("X-Request-Id", "upstream-7")
			w.Header().Set("Location", "/orders/7")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, detailsBody)
		case "/gzip":
			w.Header().Set("Vary", "Accept-Encoding")
			if strings.Contains(accept, "gzip") {
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				io.WriteString(zw, detailsBody)
				zw.Close()
				return
			}
			io.WriteString(w, detailsBody)
		case "/zstd":
			w.Header().Set("Vary", "Accept-Encoding")
			if strings.Contains(accept, "zstd") {
				w.Header().Set("Content-Encoding", "zstd")
				zw, _ := zstd.NewWriter(w)
				io.WriteString(zw, detailsBody)
				zw.Close()
				return
			}
			io.WriteString(w, detailsBody)
		case "/unknown-coding":
			w.Header().Set("Content-Encoding", "x-custom")
			w.Write(unknownCoding)
		case "/trailers":
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "with trailers")
			w.Header().Set("X-Checksum", "sum-1")
		case "/upgrade":
			upgrades.Add(1)
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijacking: %v", err)
				return
			}
			defer conn.Close()
			io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			line, _ := brw.ReadString('\n')
			io.WriteString(conn, line)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestReplayHTTPDetails runs the handler inside Caddy between the
// handlers it meets on a real site: header and CORS headers and encode
// before it, reverse_proxy to an upstream that compresses, sends trailers
// and switches protocols after it; over HTTP/1.1 and h2c.
func TestReplayHTTPDetails(t *testing.T) {
	var upgrades atomic.Int64
	up := detailsUpstream(t, &upgrades)
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9620
	https_port 9621
	grace_period 1ns
	servers {
		protocols h1 h2c
	}
}
http://localhost:9620 {
	header X-Request-Id {http.request.uuid}
	header Access-Control-Allow-Origin {header.Origin}
	idempotency {
		store memory
	}
	reverse_proxy %[1]s
}
http://127.0.0.1:9620 {
	encode zstd gzip
	idempotency {
		store memory
	}
	reverse_proxy %[1]s
}`, up.Listener.Addr()), "caddyfile")

	h1 := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	h2 := &http.Transport{DisableCompression: true, Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: h2}
	send := func(c *http.Client, url, key string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		for i := 0; i < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	replayed := func(t *testing.T, resp *http.Response) {
		t.Helper()
		if resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("not a replay: %d %v", resp.StatusCode, resp.Header)
		}
	}
	decoded := func(t *testing.T, resp *http.Response, body []byte) string {
		t.Helper()
		switch resp.Header.Get("Content-Encoding") {
		case "gzip":
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		case "zstd":
			zr, _ := zstd.NewReader(nil)
			b, err := zr.DecodeAll(body, nil)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		case "":
			return string(body)
		}
		t.Fatalf("unexpected Content-Encoding %q", resp.Header.Get("Content-Encoding"))
		return ""
	}

	t.Run("headers of the exchange", func(t *testing.T) {
		url := "http://localhost:9620/headers"
		first, _ := send(h1, url, "hdr", "Origin", "https://a.example")
		retry, _ := send(h1, url, "hdr", "Origin", "https://b.example")
		replayed(t, retry)
		firstIDs, retryIDs := first.Header.Values("X-Request-Id"), retry.Header.Values("X-Request-Id")
		if len(firstIDs) != 2 || firstIDs[1] != "upstream-7" {
			t.Fatalf("first answer's X-Request-Id %q, want Caddy's then the upstream's", firstIDs)
		}
		if len(retryIDs) != 2 || retryIDs[0] == firstIDs[0] || retryIDs[1] != "upstream-7" {
			t.Errorf("replay's X-Request-Id %q, want this request's own id, then the upstream's (first: %q)", retryIDs, firstIDs)
		}
		if got := retry.Header.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{"https://b.example"}) {
			t.Errorf("replay's Access-Control-Allow-Origin %q, want the retry's origin", got)
		}
		if got := retry.Header.Get("Location"); got != "/orders/7" {
			t.Errorf("replay's Location %q, want the upstream's", got)
		}
	})

	t.Run("codings of a compressing upstream", func(t *testing.T) {
		for _, tc := range []struct {
			name, path, coding, other string
		}{
			{"gzip", "/gzip", "gzip", "zstd"},
			{"zstd", "/zstd", "zstd", "gzip"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				url := "http://localhost:9620" + tc.path
				key := "coding-" + tc.name
				first, body := send(h1, url, key, "Accept-Encoding", tc.coding)
				if first.Header.Get("Content-Encoding") != tc.coding || decoded(t, first, body) != detailsBody {
					t.Fatalf("the upstream did not compress: %v", first.Header)
				}
				for _, accept := range []string{"", tc.other, tc.coding + ";q=0, " + tc.other, "identity"} {
					retry, body := send(h1, url, key, "Accept-Encoding", accept)
					replayed(t, retry)
					if ce := retry.Header.Get("Content-Encoding"); ce != "" || string(body) != detailsBody {
						t.Errorf("Accept-Encoding %q: replayed with Content-Encoding %q, %d bytes; want the decoded body", accept, ce, len(body))
					}
					if cl := retry.Header.Get("Content-Length"); cl != strconv.Itoa(len(detailsBody)) {
						t.Errorf("Accept-Encoding %q: Content-Length %q, want %d", accept, cl, len(detailsBody))
					}
					if v := retry.Header.Get("Vary"); v != "Accept-Encoding" {
						t.Errorf("Accept-Encoding %q: Vary %q was not kept", accept, v)
					}
				}
				for _, accept := range []string{tc.coding, "*", tc.other + ", " + tc.coding + ";q=0.5"} {
					retry, body := send(h1, url, key, "Accept-Encoding", accept)
					replayed(t, retry)
					if retry.Header.Get("Content-Encoding") != tc.coding || decoded(t, retry, body) != detailsBody {
						t.Errorf("Accept-Encoding %q: replayed with Content-Encoding %q, want the stored %s", accept, retry.Header.Get("Content-Encoding"), tc.coding)
					}
				}
			})
		}
	})

	t.Run("codings with encode around the handler", func(t *testing.T) {
		url := "http://127.0.0.1:9620/gzip"
		first, body := send(h1, url, "encode", "Accept-Encoding", "gzip")
		if first.Header.Get("Content-Encoding") != "gzip" || decoded(t, first, body) != detailsBody {
			t.Fatalf("first answer %v", first.Header)
		}
		// zstd only: the stored gzip is decoded, and encode compresses
		// the replay with zstd.
		retry, body := send(h1, url, "encode", "Accept-Encoding", "zstd")
		replayed(t, retry)
		if retry.Header.Get("Content-Encoding") != "zstd" || decoded(t, retry, body) != detailsBody {
			t.Errorf("zstd replay: Content-Encoding %q", retry.Header.Get("Content-Encoding"))
		}
		retry, body = send(h1, url, "encode")
		replayed(t, retry)
		if retry.Header.Get("Content-Encoding") != "" || string(body) != detailsBody {
			t.Errorf("plain replay: Content-Encoding %q, %d bytes", retry.Header.Get("Content-Encoding"), len(body))
		}
		retry, body = send(h1, url, "encode", "Accept-Encoding", "gzip")
		replayed(t, retry)
		if retry.Header.Get("Content-Encoding") != "gzip" || decoded(t, retry, body) != detailsBody {
			t.Errorf("gzip replay: Content-Encoding %q", retry.Header.Get("Content-Encoding"))
		}
	})

	t.Run("a coding it cannot decode", func(t *testing.T) {
		url := "http://localhost:9620/unknown-coding"
		_, stored := send(h1, url, "unknown", "Accept-Encoding", "x-custom")
		retry, body := send(h1, url, "unknown", "Accept-Encoding", "x-custom")
		replayed(t, retry)
		if !bytes.Equal(body, stored) || retry.Header.Get("Content-Encoding") != "x-custom" {
			t.Errorf("an accepted coding was not replayed as stored")
		}
		retry, body = send(h1, url, "unknown", "Accept-Encoding", "gzip")
		if retry.StatusCode != http.StatusNotAcceptable || retry.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("a coding the retry refuses: %d %v %q, want a 406 problem", retry.StatusCode, retry.Header, body)
		}
	})

	t.Run("trailers", func(t *testing.T) {
		for _, first := range []struct {
			name   string
			client *http.Client
		}{{"http1", h1}, {"h2c", h2c}} {
			key := "trailers-" + first.name
			url := "http://localhost:9620/trailers"
			resp, _ := send(first.client, url, key)
			if resp.Trailer.Get("X-Checksum") != "sum-1" {
				t.Fatalf("the first answer over %s lacks the upstream's trailer: %v", first.name, resp.Trailer)
			}
			for _, c := range []*http.Client{h1, h2c} {
				retry, body := send(c, url, key)
				replayed(t, retry)
				if string(body) != "with trailers" || retry.Trailer.Get("X-Checksum") != "sum-1" {
					t.Errorf("first over %s, replay over %s: body %q, trailers %v, want X-Checksum sum-1", first.name, retry.Proto, body, retry.Trailer)
				}
			}
		}
	})

	t.Run("101 switching protocols", func(t *testing.T) {
		upgrade := func() string {
			t.Helper()
			conn, err := net.Dial("tcp", "localhost:9620")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(conn, "POST /upgrade HTTP/1.1\r\nHost: localhost:9620\r\nIdempotency-Key: upgrade\r\n"+
				"Connection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 0\r\n\r\n")
			br := bufio.NewReader(conn)
			status, _ := br.ReadString('\n')
			if !strings.HasPrefix(status, "HTTP/1.1 101") {
				return status
			}
			for line, _ := br.ReadString('\n'); line != "\r\n" && line != ""; line, _ = br.ReadString('\n') {
			}
			io.WriteString(conn, "ping\n")
			if echo, _ := br.ReadString('\n'); echo != "ping\n" {
				t.Fatalf("the tunnel echoed %q", echo)
			}
			return status
		}
		if status := upgrade(); !strings.HasPrefix(status, "HTTP/1.1 101") {
			t.Fatalf("the first upgrade got %q", status)
		}
		// the claim ends once the tunnel closes: until then a retry gets 409
		deadline := time.Now().Add(5 * time.Second)
		status := upgrade()
		for strings.HasPrefix(status, "HTTP/1.1 409") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			status = upgrade()
		}
		if !strings.HasPrefix(status, "HTTP/1.1 101") || upgrades.Load() != 2 {
			t.Fatalf("the retry of an upgrade got %q, the upstream switched %d times; want a new switch (the claim released)", status, upgrades.Load())
		}
	})
}
