package baseline

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func init() {
	caddy.RegisterModule(PGHandler{})
	httpcaddyfile.RegisterHandlerDirective("idem_baseline_pg", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(PGHandler)
		return m, m.UnmarshalCaddyfile(h.Dispenser)
	})
}

// PGHandler is the http.handlers.idem_baseline_pg module: the least a correct
// Idempotency-Key handler does with PostgreSQL, to measure the postgres
// store against as baseline_cas measures the redis store. Per new key it
// runs two statements, each one round trip with a statement pgx prepared
// once per connection:
//
//   - one claim-or-read: an INSERT ... ON CONFLICT DO NOTHING of the key and
//     a random 16-byte owner token, combined with the read of the key's
//     existing row;
//   - one owner-checked UPDATE ... WHERE key = $1 AND token = $2 that stores
//     status, Content-Type and body.
//
// A replay is the claim-or-read alone, which then writes nothing. The table
// is a plain one with a text primary key and no other index. There is no
// key validation, scope, fingerprint, lease, expiry, reaper, header
// filtering or 5xx release: a claim whose next handler fails stays in
// flight for ever, and nothing ever takes a claim over, so the owner check
// never fails here. It is paid for because a correct handler cannot skip
// it. Never use this for anything but benchmarks.
type PGHandler struct {
	// DSN of the PostgreSQL database, as pgx parses it. The pool has pgx's
	// default size (the greater of 4 and the number of CPUs), as the
	// postgres store has, unless the DSN sets pool_max_conns. Required.
	DSN string `json:"dsn,omitempty"`
	// Table holds the records; it is created when missing. Default
	// idem_baseline_pg.
	Table string `json:"table,omitempty"`

	pool        *pgxpool.Pool
	claimSQL    string
	completeSQL string
}

// CaddyModule returns the Caddy module information.
func (PGHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idem_baseline_pg",
		New: func() caddy.Module { return new(PGHandler) },
	}
}

// Provision creates the pool and the table. Unlike the postgres store it
// needs the database up: a benchmark has no use for a late start.
func (h *PGHandler) Provision(ctx caddy.Context) error {
	if h.DSN == "" {
		return errors.New("idem_baseline_pg: dsn is required")
	}
	if h.Table == "" {
		h.Table = "idem_baseline_pg"
	}
	table := pgx.Identifier{h.Table}.Sanitize()
	// A status of 0 marks a claim in flight.
	ddl := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key          text    PRIMARY KEY,
	token        bytea   NOT NULL,
	status       integer NOT NULL DEFAULT 0,
	content_type text    NOT NULL DEFAULT '',
	body         bytea
)`, table)
	// Data-modifying CTEs write outside the snapshot of the statement, so
	// the read never sees the row that claimed inserts: exactly one branch
	// answers, unless a concurrent claim committed after the snapshot was
	// taken. The INSERT then conflicts with it while the read, in the old
	// snapshot, finds nothing: no row at all, and ServeHTTP runs the
	// statement again.
	h.claimSQL = fmt.Sprintf(`WITH claimed AS (
	INSERT INTO %[1]s (key, token) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING 1
)
SELECT true, 0, '', NULL::bytea FROM claimed
UNION ALL
SELECT false, status, content_type, body FROM %[1]s WHERE key = $1`, table)
	h.completeSQL = fmt.Sprintf(`UPDATE %s SET status = $3, content_type = $4, body = $5 WHERE key = $1 AND token = $2`, table)

	pool, err := pgxpool.New(context.Background(), h.DSN)
	if err != nil {
		return fmt.Errorf("idem_baseline_pg: creating pool: %w", err)
	}
	ddlCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pool.Exec(ddlCtx, ddl); err != nil {
		pool.Close()
		return fmt.Errorf("idem_baseline_pg: creating table %s: %w", table, err)
	}
	h.pool = pool
	return nil
}

// Cleanup closes the pool.
func (h *PGHandler) Cleanup() error {
	if h.pool != nil {
		h.pool.Close()
		h.pool = nil
	}
	return nil
}

// claimAttempts: the claim-or-read returns no row only when the key was
// committed after its snapshot, and nothing deletes rows, so the second
// run's snapshot sees the key.
const claimAttempts = 2

// ServeHTTP claims or reads the key in one statement, replays a stored
// response or answers 409 to a claim in flight, or runs next and stores its
// response with one owner-checked UPDATE.
func (h *PGHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return next.ServeHTTP(w, r)
	}
	ctx := r.Context()
	token := make([]byte, tokenLen)
	_, _ = rand.Read(token) // never fails (Go 1.24+)
	var (
		won    bool
		status int32
		ct     string
		body   []byte
		err    error
	)
	for range claimAttempts {
		err = h.pool.QueryRow(ctx, h.claimSQL, k, token).Scan(&won, &status, &ct, &body)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return caddyhttp.Error(http.StatusServiceUnavailable, errors.New("idem_baseline_pg: the key changed under every attempt"))
	case err != nil:
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	case !won && status == 0:
		w.WriteHeader(http.StatusConflict)
		return nil
	case !won:
		return writeStored(w, int(status), ct, body)
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
	// The response is out: a client that goes away now must not cancel
	// the store, which would also cost pgx the connection.
	tag, err := h.pool.Exec(context.WithoutCancel(ctx), h.completeSQL,
		k, token, int32(c.status), w.Header().Get("Content-Type"), c.buf.Bytes())
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return errors.New("idem_baseline_pg: claim lost before completion")
	}
	return nil
}

// UnmarshalCaddyfile reads:
//
//	idem_baseline_pg {
//	    dsn   <dsn>
//	    table <name>
//	}
func (h *PGHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	for d.NextBlock(0) {
		opt := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "dsn":
			h.DSN = d.Val()
		case "table":
			h.Table = d.Val()
		default:
			return d.Errf("unknown option %q", opt)
		}
	}
	return nil
}

var (
	_ caddyhttp.MiddlewareHandler = (*PGHandler)(nil)
	_ caddy.Provisioner           = (*PGHandler)(nil)
	_ caddy.CleanerUpper          = (*PGHandler)(nil)
	_ caddyfile.Unmarshaler       = (*PGHandler)(nil)
)
