// Package baseline is the floor that the idempotency handler is measured
// against in bench/run.sh: a deliberately minimal Idempotency-Key handler
// that does only the work no implementation can avoid with Redis, one
// SET NX GET to claim or read, and one SET to store the response. It has
// none of the real handler's checks (no key validation, scope, request
// fingerprint, lease renewal, 5xx release or header filtering) and must
// never be used for anything but benchmarks.
//
// Record layout: 2 bytes status, 1 byte Content-Type length, the
// Content-Type, the body. The claim placeholder is the single byte "-".
//
// With owner_check the handler does the least a correct Redis handler must
// do to complete only a claim it still owns: the claim is a random 16-byte
// token, and completion is a minimal Lua script that compares the first 16
// bytes of the key with that token (GETRANGE) before it SETs the record.
// Stored records then start with the token, which replays strip. This is
// the fair floor for the product's Redis store, whose completion is also an
// owner-checked script; the default mode (a plain SET) checks nothing.
//
// PGHandler (idem_baseline_pg, postgres.go) is the same floor for the
// product's PostgreSQL store.
package baseline

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	goredis "github.com/redis/go-redis/v9"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("idem_baseline", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(Handler)
		return m, m.UnmarshalCaddyfile(h.Dispenser)
	})
}

// Handler is the http.handlers.idem_baseline module.
type Handler struct {
	// Address of the Redis server, host:port. Default 127.0.0.1:6379.
	Address string `json:"address,omitempty"`
	// KeyPrefix starts every Redis key. Default idem_baseline:.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// TTL of stored responses. Default 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`
	// Lease of the claim placeholder. Default 30s.
	Lease caddy.Duration `json:"lease,omitempty"`
	// OwnerCheck makes the claim a random 16-byte token and completion a
	// Lua script that stores the record only if the key still starts with
	// that token (see the package comment).
	OwnerCheck bool `json:"owner_check,omitempty"`

	client  *goredis.Client
	ttlMs   int64
	leaseMs int64
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idem_baseline",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision creates the Redis client.
func (h *Handler) Provision(caddy.Context) error {
	if h.Address == "" {
		h.Address = "127.0.0.1:6379"
	}
	if h.KeyPrefix == "" {
		h.KeyPrefix = "idem_baseline:"
	}
	if h.TTL == 0 {
		h.TTL = caddy.Duration(24 * time.Hour)
	}
	if h.Lease == 0 {
		h.Lease = caddy.Duration(30 * time.Second)
	}
	h.ttlMs = time.Duration(h.TTL).Milliseconds()
	h.leaseMs = time.Duration(h.Lease).Milliseconds()
	h.client = goredis.NewClient(&goredis.Options{Addr: h.Address})
	return nil
}

// Cleanup closes the Redis client.
func (h *Handler) Cleanup() error {
	if h.client != nil {
		return h.client.Close()
	}
	return nil
}

var placeholder = []byte("-")

// tokenLen is the size of the owner token in owner_check mode: the claim
// is exactly the token, and every stored record starts with it.
const tokenLen = 16

// completeScript is the minimal owner-checked completion: ARGV[1] the
// token, ARGV[2] the record (which starts with the token), ARGV[3] the TTL
// in milliseconds. go-redis runs it with EVALSHA, falling back to EVAL.
var completeScript = goredis.NewScript(`if redis.call('GETRANGE', KEYS[1], 0, 15) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0`)

// ServeHTTP claims or reads the key with one SET NX GET, replays a stored
// response, or runs next and stores its response with one SET.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return next.ServeHTTP(w, r)
	}
	ctx := r.Context()
	key := h.KeyPrefix + k
	claim, hdrLen := placeholder, 0
	if h.OwnerCheck {
		claim, hdrLen = make([]byte, tokenLen), tokenLen
		_, _ = rand.Read(claim) // never fails (Go 1.24+)
	}
	cmd := goredis.NewStringCmd(ctx, "set", key, claim, "nx", "px", h.leaseMs, "get")
	_ = h.client.Process(ctx, cmd)
	old, err := cmd.Bytes()
	switch {
	case errors.Is(err, goredis.Nil):
		// claimed: run below
	case err != nil:
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	case len(old) == len(claim):
		// another request's claim ("-", or a bare token with owner_check)
		w.WriteHeader(http.StatusConflict)
		return nil
	case len(old) < hdrLen:
		return caddyhttp.Error(http.StatusInternalServerError, errors.New("corrupt baseline record"))
	default:
		return replay(w, old[hdrLen:])
	}

	c := capturePool.Get().(*capture)
	c.ResponseWriter, c.status = w, 0
	c.buf.Reset()
	defer func() {
		c.ResponseWriter = nil
		capturePool.Put(c)
	}()
	if err := next.ServeHTTP(c, r); err != nil {
		return err
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	ct := w.Header().Get("Content-Type")
	if len(ct) > 255 {
		ct = ""
	}
	rec := make([]byte, 0, hdrLen+3+len(ct)+c.buf.Len())
	if h.OwnerCheck {
		rec = append(rec, claim...)
	}
	rec = append(rec, byte(c.status>>8), byte(c.status), byte(len(ct)))
	rec = append(rec, ct...)
	rec = append(rec, c.buf.Bytes()...)
	if h.OwnerCheck {
		n, err := completeScript.Run(ctx, h.client, []string{key}, claim, rec, h.ttlMs).Int64()
		if err != nil {
			return err
		}
		if n != 1 {
			return errors.New("idem_baseline: claim lost before completion")
		}
		return nil
	}
	set := goredis.NewStatusCmd(ctx, "set", key, rec, "px", h.ttlMs)
	_ = h.client.Process(ctx, set)
	return set.Err()
}

var replayed = []string{"true"}

func replay(w http.ResponseWriter, rec []byte) error {
	if len(rec) < 3 || len(rec) < 3+int(rec[2]) {
		return caddyhttp.Error(http.StatusInternalServerError, errors.New("corrupt baseline record"))
	}
	ctEnd := 3 + int(rec[2])
	return writeStored(w, int(rec[0])<<8|int(rec[1]), string(rec[3:ctEnd]), rec[ctEnd:])
}

// writeStored replays a stored response: status, Content-Type and body.
func writeStored(w http.ResponseWriter, status int, contentType string, body []byte) error {
	hdr := w.Header()
	if contentType != "" {
		hdr["Content-Type"] = []string{contentType}
	}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Idempotent-Replayed"] = replayed
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// capture passes the response through and keeps a copy of the body. It
// deliberately hides io.ReaderFrom so that every byte goes through Write.
type capture struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

var capturePool = sync.Pool{New: func() any { return new(capture) }}

func (c *capture) WriteHeader(status int) {
	if c.status == 0 && status >= 200 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.buf.Write(p)
	return c.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (flushes).
func (c *capture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// UnmarshalCaddyfile reads:
//
//	idem_baseline {
//	    address    <host:port>
//	    key_prefix <prefix>
//	    ttl        <duration>
//	    lease      <duration>
//	    owner_check
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	for d.NextBlock(0) {
		opt := d.Val()
		if opt == "owner_check" {
			if d.NextArg() {
				return d.ArgErr()
			}
			h.OwnerCheck = true
			continue
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		val := d.Val()
		switch opt {
		case "address":
			h.Address = val
		case "key_prefix":
			h.KeyPrefix = val
		case "ttl", "lease":
			dur, err := caddy.ParseDuration(val)
			if err != nil {
				return d.Errf("%s: %v", opt, err)
			}
			if opt == "ttl" {
				h.TTL = caddy.Duration(dur)
			} else {
				h.Lease = caddy.Duration(dur)
			}
		default:
			return d.Errf("unknown option %q", opt)
		}
	}
	return nil
}

var (
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
