package idempotency

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// serveReal serves h in front of next on a real net/http server, which,
// unlike httptest.ResponseRecorder, refuses a body for a status that
// allows none (http.ErrBodyNotAllowed).
func serveReal(t *testing.T, h *Handler, next caddyhttp.Handler) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, _ = withReplacer(r)
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Errorf("ServeHTTP returned %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// plainClient sends no Accept-Encoding of its own and shows bodies as sent.
func plainClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// sendPost posts body under key to srv and reads the whole answer.
func sendPost(t *testing.T, c *http.Client, url, key string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(`{"sku":"tea"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return res, string(body), err
}

// A handler that writes a body after a status that allows none (Caddy's
// respond "x" 204, a PHP script that echoes after http_response_code(204))
// gives its client a clean answer without one, which net/http makes so:
// the retries must get that same answer, not an aborted connection.
func TestReplayNoBodyStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		header map[string]string
	}{
		{"204", http.StatusNoContent, nil},
		{"304", http.StatusNotModified, map[string]string{"ETag": `"v7"`}},
		// a 304 carries the headers of the representation the client has:
		// there is no body to decode for a retry that accepts no coding
		{"304 gzip", http.StatusNotModified, map[string]string{"ETag": `"v7"`, "Content-Encoding": "gzip"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provision(t, storeConfigs[0].raw(t), nil)
			b := &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
				for name, value := range tc.header {
					w.Header().Set(name, value)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, "x")
				return nil
			}}
			srv := serveReal(t, h, b)
			c := plainClient(t)
			key := "nobody-" + strings.ReplaceAll(tc.name, " ", "-")
			first, body, err := sendPost(t, c, srv.URL, key)
			if err != nil || first.StatusCode != tc.status || body != "" {
				t.Fatalf("first request: %v, %q, %v; want a clean %d", first, body, err, tc.status)
			}
			for i := range 3 {
				retry, body, err := sendPost(t, c, srv.URL, key)
				if err != nil {
					t.Fatalf("retry %d: %v: the replay aborted", i, err)
				}
				if retry.StatusCode != tc.status || body != "" || retry.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry %d: %d %q, body %q; want the replayed %d without a body", i, retry.StatusCode, retry.Header, body, tc.status)
				}
				for name, value := range tc.header {
					if got := retry.Header.Get(name); got != value {
						t.Errorf("retry %d: %s %q, want the stored %q", i, name, got, value)
					}
				}
				if cl := retry.Header.Get("Content-Length"); cl != "" {
					t.Errorf("retry %d: Content-Length %q on a %d", i, cl, tc.status)
				}
			}
			if n := b.runs.Load(); n != 1 {
				t.Errorf("the backend ran %d times, want 1", n)
			}
			// what was stored: the answer as the client got it, no body
			req := post("/orders", key, `{"sku":"tea"}`)
			req.Host = "127.0.0.1" // the endpoint the key was used for
			r := do(h, b, req)
			wantStatus(t, r, tc.status)
			if r.Body.Len() != 0 {
				t.Errorf("the stored %d holds the body %q", tc.status, r.Body)
			}
		})
	}
}

// A record of a status without a body that holds one anyway (stored
// before the recorder dropped such bodies) is replayed without it.
func TestReplayStoredBodyOfNoBodyStatus(t *testing.T) {
	h := provision(t, storeConfigs[0].raw(t), nil)
	for _, status := range []int{http.StatusNoContent, http.StatusNotModified} {
		rec := &store.Record{State: store.Completed, Response: store.Response{
			Status: status, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("x")}}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r, repl := withReplacer(r)
			a := &attempt{h: h, w: w, r: r, repl: repl}
			if err := a.replay(rec); err != nil {
				t.Errorf("replay: %v", err)
			}
		}))
		res, body, err := sendPost(t, plainClient(t), srv.URL, "stored-body")
		srv.Close()
		if err != nil {
			t.Fatalf("%d with a stored body: %v: the replay aborted", status, err)
		}
		if res.StatusCode != status || body != "" || res.Header.Get("Content-Length") != "" {
			t.Errorf("%d with a stored body: replayed %d %q, body %q; want %d, no body, no length", status, res.StatusCode, res.Header, body, status)
		}
	}
}
