package idempotency

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Clients that read a decoded replay slowly, or not at all, hold no decode
// slot: the replay of a stored gzip body to a retry that does not accept
// gzip goes on for every other client meanwhile.
func TestSlowReadersHoldNoDecodeSlot(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	plain := bytes.Repeat([]byte("tea, "), 6<<20) // 30 MiB decoded: more than the sockets buffer
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(plain)
	zw.Close()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(zipped.Bytes())
		return nil
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Errorf("ServeHTTP: %v", err)
		}
	}))
	defer srv.Close()
	send := func(acceptGzip bool) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", bytes.NewReader([]byte("{}")))
		req.Header.Set("Idempotency-Key", "slow-readers")
		if acceptGzip {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := send(true)
	io.Copy(io.Discard, first.Body)
	first.Body.Close()

	// Clients that ask for the decoded replay and never read it.
	for range maxDecodes + 2 {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "POST /orders HTTP/1.1\r\nHost: "+srv.Listener.Addr().String()+"\r\nIdempotency-Key: slow-readers\r\nContent-Length: 2\r\n\r\n{}")
	}
	time.Sleep(500 * time.Millisecond) // their replays are under way, stuck on full sockets

	start := time.Now()
	resp := send(false)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, plain) {
		t.Fatalf("a replay beside %d stuck readers: %d, %d bytes after %v; want 200 and the %d decoded bytes",
			maxDecodes+2, resp.StatusCode, len(got), time.Since(start), len(plain))
	}
}
