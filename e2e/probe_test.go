package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

func TestProbeEncode(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", fmt.Sprintf(`encode {
	gzip
	minimum_length 10
}
route {
	idempotency
	reverse_proxy %s
}`, u.host()))
	cl := newClient()
	mk := func(ae string) *http.Request {
		return req("POST", c.URL+"/x", "enc-1", []byte(`{}`), "Accept-Encoding", ae)
	}
	for _, ae := range []string{"gzip", "gzip", "identity", ""} {
		r, _ := retryUntilSettled(t, cl, func() *http.Request { return mk(ae) }, 5*time.Second)
		t.Logf("AE=%q -> %d CE=%q CL=%q len=%d replayed=%v vary=%q", ae, r.Status, r.Header.Get("Content-Encoding"), r.Header.Get("Content-Length"), len(r.Body), r.replayed(), r.Header.Values("Vary"))
	}
	t.Logf("starts %d", u.starts("enc-1"))
}

func TestProbe204(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient()
	for i := 0; i < 2; i++ {
		r, _ := retryUntilSettled(t, cl, func() *http.Request { return req("POST", c.URL+"/x", "nc-1", []byte(`{}`), hdrStatus, "204") }, 5*time.Second)
		t.Logf("%d %v %q", r.Status, r.Header, r.Body)
	}
}

func TestProbeStreamDisconnect(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient()
	mk := func() *http.Request { return req("POST", c.URL+"/x", "sd-1", []byte(`{}`), hdrStream, "1") }
	ctx, cancel := context.WithCancel(context.Background())
	res, err := cl.Do(mk().WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len(firstChunk))
	io.ReadFull(res.Body, b)
	cancel()
	res.Body.Close()
	eventually(5*time.Second, 10*time.Millisecond, func() bool { return u.completions("sd-1")+u.cancelled("sd-1") > 0 })
	r, n := retryUntilSettled(t, cl, mk, 5*time.Second)
	t.Logf("after %d 409: %d %q replayed=%v starts=%d cancelled=%d", n, r.Status, r.Body, r.replayed(), u.starts("sd-1"), u.cancelled("sd-1"))
}

func TestProbeLargeDisconnect(t *testing.T) {
	t.Parallel()
	u := startUpstream(t)
	c := startCaddy(t, "caddy", proxySite(u, ""))
	cl := newClient()
	mk := func() *http.Request { return req("POST", c.URL+"/x", "ld-1", []byte(`{}`), hdrSize, "8000000", hdrDelay, "300ms") }
	ctx, cancel := context.WithCancel(context.Background())
	res, err := cl.Do(mk().WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1000)
	io.ReadFull(res.Body, b)
	cancel()
	res.Body.Close()
	eventually(5*time.Second, 10*time.Millisecond, func() bool { return u.completions("ld-1")+u.cancelled("ld-1") > 0 })
	r, n := retryUntilSettled(t, cl, mk, 5*time.Second)
	t.Logf("after %d 409: %d %q replayed=%v starts=%d cancelled=%d", n, r.Status, r.Body, r.replayed(), u.starts("ld-1"), u.cancelled("ld-1"))
}
