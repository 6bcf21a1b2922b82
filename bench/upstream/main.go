// Command upstream is the application behind every benchmark route: it
// answers any request with a small JSON 201, and any path containing
// /big with 1 MiB (or
// ?size=N bytes). It writes its address to -addr-file once it listens.
// GET /_runs answers how many requests each route (the first segment of
// the path) has run so far, as JSON: loadgen checks that a route ran each
// new key once, and no replay.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

var small = []byte(`{"order_id":"0f8fad5b-d9cb-469f-a165-70867728950e","status":"created"}`)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	addrFile := flag.String("addr-file", "", "write the bound address here")
	flag.Parse()

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	smallLen := strconv.Itoa(len(small))

	var runs sync.Map // route → *atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_runs" {
			counts := map[string]int64{}
			runs.Range(func(route, n any) bool {
				counts[route.(string)] = n.(*atomic.Int64).Load()
				return true
			})
			_ = json.NewEncoder(w).Encode(counts)
			return
		}
		route, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		n, ok := runs.Load(route)
		if !ok {
			n, _ = runs.LoadOrStore(route, new(atomic.Int64))
		}
		n.(*atomic.Int64).Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.Path, "/big") {
			serveBig(w, r, big)
			return
		}
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{smallLen}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(small)
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal((&http.Server{Handler: handler}).Serve(ln))
}

// serveBig answers 1 MiB, or ?size=N bytes of it.
func serveBig(w http.ResponseWriter, r *http.Request, big []byte) {
	n := len(big)
	if s := r.URL.Query().Get("size"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v >= 0 && v <= len(big) {
			n = v
		}
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/octet-stream"}
	h["Content-Length"] = []string{strconv.Itoa(n)}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(big[:n])
}
