package idempotency

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// arrivals counts the bytes read from a request body, and reports once
// when want of them have come.
type arrivals struct {
	io.ReadCloser
	n, want int
	arrived func()
}

func (a *arrivals) Read(p []byte) (int, error) {
	n, err := a.ReadCloser.Read(p)
	if a.n < a.want && a.n+n >= a.want {
		a.arrived()
	}
	a.n += n
	return n, err
}

// A declared Content-Length is not an allocation: 1,000 slow clients that
// declare 1 MiB and send 1 KiB, each blocked mid-body on a real server,
// hold what they sent, not what they declared. Each is measured against
// the same client on a route that reads 1 KiB without the handler.
func TestSlowClientsHoldWhatTheySent(t *testing.T) {
	const clients, declared, sent = 1000, 1 << 20, 1 << 10
	h := provision(t, json.RawMessage(`{"module":"memory"}`), func(h *Handler) { h.MaxRequestBody = 2 * declared })
	var arrived, serving sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer serving.Done()
		r.Body = &arrivals{ReadCloser: r.Body, want: sent, arrived: arrived.Done}
		if r.URL.Path == "/plain" {
			var b [sent]byte
			io.ReadFull(r.Body, b[:])
			r.Body.Read(b[:1]) // blocks until the client leaves
			return
		}
		r, _ = withReplacer(r)
		h.ServeHTTP(w, r, &backend{})
	}))
	defer srv.Close()

	heapPerClient := func(path string) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		conns := make([]net.Conn, 0, clients)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
			serving.Wait() // so that the next measurement starts from an idle server
		}()
		arrived.Add(clients)
		serving.Add(clients)
		var dialErr atomic.Value
		for i := range clients {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatalf("dialing client %d: %v", i, err)
			}
			conns = append(conns, c)
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: api.example.com\r\nIdempotency-Key: slow-%s-%d\r\nContent-Length: %d\r\n\r\n", path, path[1:], i, declared)
			if _, err := io.WriteString(c, head+strings.Repeat("x", sent)); err != nil {
				dialErr.Store(err)
			}
		}
		if err, _ := dialErr.Load().(error); err != nil {
			t.Fatalf("sending: %v", err)
		}
		done := make(chan struct{})
		go func() { arrived.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("the bodies did not arrive within 60s")
		}
		time.Sleep(100 * time.Millisecond) // every reader is blocked on its next read
		runtime.GC()
		runtime.ReadMemStats(&after)
		return float64(after.HeapInuse-before.HeapInuse) / clients
	}

	heapPerClient("/plain") // the server's and the runtime's tables grow to 1,000 connections
	handled := heapPerClient("/orders")
	plain := heapPerClient("/plain")
	t.Logf("heap in use per slow client: %.1f KiB through the handler, %.1f KiB without it; the handler holds %.1f KiB",
		handled/1024, plain/1024, (handled-plain)/1024)
	if held := handled - plain; held > 8*sent {
		t.Errorf("the handler holds %.1f KiB per client that sent %d bytes of the %d it declared; want about what it sent",
			held/1024, sent, declared)
	}
}
