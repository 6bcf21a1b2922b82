package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
)

// proxySite is a site that guards everything with idempotency (options
// inside its block) in front of reverse_proxy to u.
func proxySite(u *upstream, options string) string {
	return fmt.Sprintf(`route {
	idempotency {
%s
	}
	reverse_proxy %s
}`, options, u.host())
}

func redisStore(rd *testredis.Server) string {
	return fmt.Sprintf(`store redis {
	address %s
}`, rd.Addr())
}

// stores runs f as parallel subtests against the memory store and against
// a private Redis.
func stores(t *testing.T, f func(t *testing.T, storeOptions string)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, "store memory")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		f(t, redisStore(testredis.Start(t)))
	})
}

// The basic protocol, with the default (memory) store.
func TestMemoryStoreProtocol(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "memory", fmt.Sprintf(`
route /strict/* {
	idempotency {
		required
	}
	reverse_proxy %[1]s
}
route {
	idempotency
	reverse_proxy %[1]s
}`, u.host()))
	cl := newClient(t)
	body := []byte(`{"sku":"tea","qty":1}`)
	post := func(key, path string, body []byte) *http.Request {
		return req(http.MethodPost, c.URL+path, key, body, hdrCookie, "1")
	}

	first := send(t, cl, post("order-1", "/orders", body))
	wantStatus(t, "first request", first, http.StatusCreated)
	if first.replayed() {
		t.Fatalf("first request marked as replayed: %s", first)
	}
	if len(first.Header.Values("Set-Cookie")) != 1 {
		t.Fatalf("first request: want the upstream's Set-Cookie, got %q", first.Header.Values("Set-Cookie"))
	}
	if !bytes.Equal(first.Body, u.sentBody("order-1", 1)) {
		t.Fatalf("first answer %q differs from what the upstream sent %q", first.Body, u.sentBody("order-1", 1))
	}
	wantCount(t, "upstream runs after the first request", u.starts("order-1"), 1)

	replay, conflicts := retryUntilSettled(t, cl, func() *http.Request { return post("order-1", "/orders", body) }, 5*time.Second)
	if conflicts > 0 {
		t.Logf("the retry sent right after the first answer got %d x 409 before the replay", conflicts)
	}
	wantReplay(t, "retry", first, replay)
	if replay.Header.Get("Content-Length") != strconv.Itoa(len(first.Body)) {
		t.Fatalf("replay Content-Length %q, body %d bytes", replay.Header.Get("Content-Length"), len(first.Body))
	}
	// The sf-string spelling of the key is the same key.
	quoted := send(t, cl, post(`"order-1"`, "/orders", body))
	wantReplay(t, "retry with the quoted key", first, quoted)
	wantCount(t, "upstream runs after the retries", u.starts("order-1"), 1)

	other := send(t, cl, post("order-1", "/orders", []byte(`{"sku":"coffee","qty":1}`)))
	wantProblem(t, "same key, other body", other, http.StatusUnprocessableEntity, "key-reused", false)
	other = send(t, cl, post("order-1", "/refunds", body))
	wantProblem(t, "same key, other path", other, http.StatusUnprocessableEntity, "key-reused", false)
	wantCount(t, "upstream runs after the mismatches", u.starts("order-1"), 1)
	wantReplay(t, "retry after the mismatches", first, send(t, cl, post("order-1", "/orders", body)))

	// GET is not covered: it passes through with its key, every time.
	for i := 1; i <= 2; i++ {
		get := send(t, cl, req(http.MethodGet, c.URL+"/orders", "get-1", nil))
		wantStatus(t, "GET", get, http.StatusCreated)
		if get.replayed() || get.Header.Get(hdrRun) != strconv.Itoa(i) {
			t.Fatalf("GET %d: want run %d passed through, got %s", i, i, get)
		}
	}
	wantCount(t, "upstream runs of GET", u.starts("get-1"), 2)

	missing := send(t, cl, req(http.MethodPost, c.URL+"/strict/orders", "", body))
	wantProblem(t, "required route without a key", missing, http.StatusBadRequest, "missing-key", false)
	wantCount(t, "upstream runs without a key", u.starts(""), 0)
	withKey := send(t, cl, post("strict-1", "/strict/orders", body))
	wantStatus(t, "required route with a key", withKey, http.StatusCreated)
	wantCount(t, "upstream runs on the required route", u.starts("strict-1"), 1)
}

// Concurrent duplicates run once; the others get 409 and, after
// completion, the replay.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		c := startCaddy(t, "caddy", proxySite(u, storeOptions))
		concurrentDuplicates(t, u, []*caddyProc{c}, "api.test")
	})
}

// fanOut sends mk(0) to mk(n-1) at once, one goroutine each. The slices
// fill in as answers come; answered counts them and wg ends with the last.
func fanOut(cl *http.Client, n int, mk func(int) *http.Request) ([]response, []error, *atomic.Int32, *sync.WaitGroup) {
	results := make([]response, n)
	errs := make([]error, n)
	answered := new(atomic.Int32)
	wg := new(sync.WaitGroup)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = do(cl, mk(i))
			answered.Add(1)
		}()
	}
	close(start)
	return results, errs, answered, wg
}

// concurrentDuplicates sends 50 identical requests at once, spread over the
// instances, to an upstream that holds the first one until the 49 others
// have been answered. It returns the index of the instance that ran it.
// The requests carry the Host host, as behind a load balancer; with host ""
// each carries its instance's own address, 127.0.0.1 and a port of its own.
func concurrentDuplicates(t *testing.T, u *upstream, instances []*caddyProc, host string) int {
	const n = 50
	const key = "dup-1"
	body := []byte(`{"amount":1000,"currency":"EUR"}`)
	mk := func(i int) *http.Request {
		r := req(http.MethodPost, instances[i%len(instances)].URL+"/payments", key, body, hdrGate, "1")
		if host != "" {
			r.Host = host
		}
		return r
	}
	cl := newClient(t)
	results, errs, answered, wg := fanOut(cl, n, mk)
	// The upstream holds the request that runs; every other one must be
	// refused meanwhile. (Should two run, only n-2 get answered: the gate
	// opens at the deadline and the count check below fails.)
	if !eventually(15*time.Second, 5*time.Millisecond, func() bool { return answered.Load() >= n-1 }) {
		t.Errorf("only %d of %d duplicates answered while the first one ran", answered.Load(), n-1)
	}
	u.openGate()
	wg.Wait()

	winner, conflicts := -1, 0
	for i, r := range results {
		switch {
		case errs[i] != nil:
			t.Errorf("request %d: %v", i, errs[i])
		case r.Status == http.StatusCreated && !r.replayed():
			if winner >= 0 {
				t.Errorf("requests %d and %d both ran", winner, i)
			}
			winner = i
		case r.Status == http.StatusConflict:
			wantProblem(t, fmt.Sprintf("duplicate %d", i), r, http.StatusConflict, "outstanding", true)
			conflicts++
		default:
			t.Errorf("request %d: unexpected answer %s", i, r)
		}
	}
	wantCount(t, "upstream runs", u.starts(key), 1)
	if t.Failed() || winner < 0 {
		t.FailNow()
	}
	wantCount(t, "409 answers", conflicts, n-1)

	// After completion every instance replays, to concurrent retries too.
	settled, _ := retryUntilSettled(t, cl, func() *http.Request { return mk(0) }, 5*time.Second)
	wantReplay(t, "first retry", results[winner], settled)
	var rwg sync.WaitGroup
	replays := make([]response, 10*len(instances))
	rerrs := make([]error, len(replays))
	for i := range replays {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			replays[i], rerrs[i] = do(cl, mk(i))
		}()
	}
	rwg.Wait()
	for i, r := range replays {
		if rerrs[i] != nil {
			t.Fatalf("retry %d: %v", i, rerrs[i])
		}
		wantReplay(t, fmt.Sprintf("retry %d on instance %d", i, i%len(instances)), results[winner], r)
	}
	wantCount(t, "upstream runs after the retries", u.starts(key), 1)
	return winner % len(instances)
}

// The headline story: the client gives up, the upstream finishes anyway,
// and the retry gets the response the client missed.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, storeOptions string) {
		u := startUpstream(t)
		durableClientDisconnect(t, u, startCaddy(t, "caddy", proxySite(u, storeOptions)))
	})
}

// A response larger than max_response_body reaches the first client
// whole; a retry does not run again and gets a 409 problem.
func TestLargeResponse(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, "max_response_body 1MiB"))
	cl := newClient(t)
	const key, size = "export-1", 2 << 20
	mk := func() *http.Request {
		return req(http.MethodPost, c.URL+"/exports", key, []byte(`{}`), hdrSize, strconv.Itoa(size))
	}
	first := send(t, cl, mk())
	wantStatus(t, "first request", first, http.StatusCreated)
	if len(first.Body) != size || !bytes.Equal(first.Body, pattern(size)) {
		t.Fatalf("first client got %d bytes, want the upstream's %d", len(first.Body), size)
	}
	retry, _ := retryUntilSettled(t, cl, mk, 5*time.Second)
	wantProblem(t, "retry of an oversized response", retry, http.StatusConflict, "unreplayable", false)
	wantCount(t, "upstream runs", u.starts(key), 1)

	// A client that leaves in the middle of the body: the upstream still
	// completes, and the retry is refused the same way.
	const key2 = "export-2"
	leaving := func() *http.Request {
		return req(http.MethodPost, c.URL+"/exports", key2, []byte(`{}`), hdrSize, strconv.Itoa(8<<20))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := cl.Do(leaving().WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(res.Body, make([]byte, 64<<10)); err != nil {
		t.Fatalf("reading the start of the body: %v", err)
	}
	cancel()
	res.Body.Close()
	if !eventually(5*time.Second, 10*time.Millisecond, func() bool { return u.completions(key2)+u.cancelled(key2) > 0 }) {
		t.Fatal("the upstream never finished")
	}
	wantCount(t, "upstream requests cancelled after the client left", u.cancelled(key2), 0)
	retry, _ = retryUntilSettled(t, cl, leaving, 5*time.Second)
	wantProblem(t, "retry after the client left an oversized response", retry, http.StatusConflict, "unreplayable", false)
	wantCount(t, "upstream runs", u.starts(key2), 1)
}

// A streamed response reaches the client as it is flushed, and the
// retry replays it whole.
func TestStreaming(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient(t)
	const key = "stream-1"
	mk := func() *http.Request {
		return req(http.MethodPost, c.URL+"/events", key, []byte(`{}`), hdrStream, "1")
	}
	res, err := cl.Do(mk())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	wantStatus(t, "streamed request", response{Status: res.StatusCode, Header: res.Header}, http.StatusCreated)
	chunk := make([]byte, len(firstChunk))
	if _, err := io.ReadFull(res.Body, chunk); err != nil {
		t.Fatalf("reading the first chunk: %v", err)
	}
	if string(chunk) != firstChunk {
		t.Fatalf("first chunk %q, want %q", chunk, firstChunk)
	}
	if u.secondChunkWritten(key) {
		t.Fatal("the first chunk reached the client only after the upstream wrote the second: flushes do not pass through")
	}
	rest, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the rest: %v", err)
	}
	whole := append(chunk, rest...)
	if string(whole) != firstChunk+secondChunk {
		t.Fatalf("streamed body %q", whole)
	}
	retry, _ := retryUntilSettled(t, cl, mk, 5*time.Second)
	wantReplay(t, "retry of a streamed response", response{Status: res.StatusCode, Header: res.Header, Body: whole}, retry)
	wantCount(t, "upstream runs", u.starts(key), 1)

	// A client that leaves after the first chunk: the upstream streams on,
	// and the retry replays the whole stream.
	const key2 = "stream-2"
	leaving := func() *http.Request {
		return req(http.MethodPost, c.URL+"/events", key2, []byte(`{}`), hdrStream, "1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res2, err := cl.Do(leaving().WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(res2.Body, chunk); err != nil {
		t.Fatalf("reading the first chunk: %v", err)
	}
	cancel()
	res2.Body.Close()
	if !eventually(5*time.Second, 10*time.Millisecond, func() bool { return u.completions(key2)+u.cancelled(key2) > 0 }) {
		t.Fatal("the upstream never finished")
	}
	wantCount(t, "upstream requests cancelled after the client left", u.cancelled(key2), 0)
	retry, _ = retryUntilSettled(t, cl, leaving, 5*time.Second)
	wantStatus(t, "retry after the client left the stream", retry, http.StatusCreated)
	if !retry.replayed() || string(retry.Body) != firstChunk+secondChunk {
		t.Fatalf("retry after the client left the stream did not replay it whole: %s", retry)
	}
	wantCount(t, "upstream runs", u.starts(key2), 1)
}

// The handler sits inside encode: the stored response is the uncompressed
// one, and each replay is encoded for the client that asks.
func TestCompression(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", "encode {\n\tgzip\n\tminimum_length 10\n}\n"+proxySite(u, ""))
	cl := newClient(t)
	const key = "gzip-1"
	mk := func(acceptEncoding string) func() *http.Request {
		return func() *http.Request {
			return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), "Accept-Encoding", acceptEncoding)
		}
	}
	gunzip := func(r response) []byte {
		t.Helper()
		if r.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("not gzip-encoded: %s", r)
		}
		zr, err := gzip.NewReader(bytes.NewReader(r.Body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := send(t, cl, mk("gzip")())
	wantStatus(t, "first request", first, http.StatusCreated)
	plain := gunzip(first)
	if !bytes.Equal(plain, u.sentBody(key, 1)) {
		t.Fatalf("first answer decodes to %q, the upstream sent %q", plain, u.sentBody(key, 1))
	}
	gz, _ := retryUntilSettled(t, cl, mk("gzip"), 5*time.Second)
	if !gz.replayed() || !bytes.Equal(gunzip(gz), plain) {
		t.Fatalf("gzip replay: %s", gz)
	}
	id, _ := retryUntilSettled(t, cl, mk("identity"), 5*time.Second)
	if !id.replayed() || id.Header.Get("Content-Encoding") != "" || !bytes.Equal(id.Body, plain) {
		t.Fatalf("identity replay: %s", id)
	}
	wantCount(t, "upstream runs", u.starts(key), 1)
}

// A 5xx answer is not stored; the retry runs again and its success
// is what later retries replay.
func TestServerErrorIsRetried(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient(t)
	const key = "flaky-1"
	mk := func() *http.Request {
		return req(http.MethodPost, c.URL+"/orders", key, []byte(`{"sku":"tea"}`), hdrStatus, "503,201")
	}
	first := send(t, cl, mk())
	wantStatus(t, "first request", first, http.StatusServiceUnavailable)
	if first.replayed() {
		t.Fatalf("5xx marked as replayed: %s", first)
	}
	second, _ := retryUntilSettled(t, cl, mk, 5*time.Second)
	wantStatus(t, "second request", second, http.StatusCreated)
	if second.replayed() || second.Header.Get(hdrRun) != "2" {
		t.Fatalf("second request did not run anew: %s", second)
	}
	wantCount(t, "upstream runs after the second request", u.starts(key), 2)
	third, _ := retryUntilSettled(t, cl, mk, 5*time.Second)
	wantReplay(t, "third request", second, third)
	wantCount(t, "upstream runs after the third request", u.starts(key), 2)
}

// The upstream receives the body exactly as sent, with a length or
// chunked; the framing does not change the fingerprint.
func TestRequestBodyIntact(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, "max_request_body 128KiB"))
	cl := newClient(t)
	body := make([]byte, 64<<10)
	for i := range body {
		body[i] = byte(i) // every byte value, 256 times
	}

	// With Content-Length.
	res := send(t, cl, req(http.MethodPost, c.URL+"/upload", "body-len", body))
	wantStatus(t, "upload with Content-Length", res, http.StatusCreated)
	got, te := u.receivedBody("body-len", 1)
	if !bytes.Equal(got, body) {
		t.Fatalf("upstream got %d bytes that differ from the %d sent", len(got), len(body))
	}
	t.Logf("Content-Length upload reached the upstream with transfer codings %q", te)

	// Chunked: no Content-Length.
	chunked := func() *http.Request {
		r := req(http.MethodPost, c.URL+"/upload", "body-chunked", nil)
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:1000]), bytes.NewReader(body[1000:])))
		r.ContentLength = -1
		return r
	}
	first := send(t, cl, chunked())
	wantStatus(t, "chunked upload", first, http.StatusCreated)
	got, te = u.receivedBody("body-chunked", 1)
	if !bytes.Equal(got, body) {
		t.Fatalf("upstream got %d bytes that differ from the %d sent chunked", len(got), len(body))
	}
	t.Logf("chunked upload reached the upstream with transfer codings %q", te)
	retry, _ := retryUntilSettled(t, cl, chunked, 5*time.Second)
	wantReplay(t, "chunked retry", first, retry)
	// The same bytes with a Content-Length are the same request.
	wantReplay(t, "retry with Content-Length", first, send(t, cl, req(http.MethodPost, c.URL+"/upload", "body-chunked", body)))
	wantCount(t, "upstream runs of the chunked upload", u.starts("body-chunked"), 1)

	// Larger than max_request_body: refused before the upstream.
	big := append(body, body...)
	big = append(big, body...)
	tooLarge := send(t, cl, req(http.MethodPost, c.URL+"/upload", "body-big", big))
	wantProblem(t, "body over max_request_body", tooLarge, http.StatusRequestEntityTooLarge, "request-too-large", false)
	r := req(http.MethodPost, c.URL+"/upload", "body-big-chunked", nil)
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(big)), -1
	tooLarge = send(t, cl, r)
	wantProblem(t, "chunked body over max_request_body", tooLarge, http.StatusRequestEntityTooLarge, "request-too-large", false)
	wantCount(t, "upstream runs of oversized bodies", u.starts("body-big")+u.starts("body-big-chunked"), 0)
}
