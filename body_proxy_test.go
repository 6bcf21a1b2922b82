package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// An upstream that answers before it reads the request body: reverse_proxy's
// transport goes on sending the body after the handler returned, and no
// request's bytes may then reach another request's upstream read. The
// upstream's receive buffer is small, so that the transport is still
// sending when the answer is complete.
func TestBodyOutlivesTheHandler(t *testing.T) {
	const bodySize, workers, perWorker = 60 << 10, 8, 25
	bodyOf := func(seed int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("<%06d>", seed)), bodySize/8)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
		return err
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mixed, whole atomic.Int64
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seed, _ := strconv.Atoi(r.Header.Get("X-Seed"))
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("ok"))
		http.NewResponseController(w).Flush()
		time.Sleep(20 * time.Millisecond) // the handler is done, another request reads its body
		got, _ := io.ReadAll(r.Body)
		if !bytes.HasPrefix(bodyOf(seed), got) {
			mixed.Add(1)
		} else if len(got) == bodySize {
			whole.Add(1)
		}
	})}
	go upstream.Serve(ln)
	defer upstream.Close()

	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
	admin localhost:2999
	http_port 9591
	https_port 9547
	grace_period 1ns
}
http://localhost:9591 {
	idempotency {
		store memory
		max_request_body 1MB
	}
	reverse_proxy %s
}`, ln.Addr()), "caddyfile")

	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				seed := w*perWorker + i
				req, _ := http.NewRequest(http.MethodPost, "http://localhost:9591/orders", bytes.NewReader(bodyOf(seed)))
				req.Header.Set("Idempotency-Key", "outlive-"+strconv.Itoa(seed))
				req.Header.Set("X-Seed", strconv.Itoa(seed))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the upstream's last reads
	t.Logf("%d requests: %d bodies read whole by the upstream, %d mixed with another request's", workers*perWorker, whole.Load(), mixed.Load())
	if n := failed.Load(); n > 0 {
		t.Errorf("%d requests failed", n)
	}
	if n := mixed.Load(); n > 0 {
		t.Errorf("the upstream read %d bodies holding another request's bytes", n)
	}
}
