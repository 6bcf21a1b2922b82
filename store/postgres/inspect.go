package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// registryName identifies the table a store uses: the server, the
// database, the schema and the table, never the user or the password.
func registryName(cfg *pgxpool.Config, schema, table string) string {
	name := table
	if schema == "" {
		// The table is the first of the search_path's that has it; a DSN
		// that sets search_path may mean another table of the same name.
		schema = cfg.ConnConfig.RuntimeParams["search_path"]
	}
	if schema != "" {
		name = schema + "." + table
	}
	host := cfg.ConnConfig.Host + ":" + strconv.Itoa(int(cfg.ConnConfig.Port))
	return "postgres:" + host + "/" + cfg.ConnConfig.Database + "/" + name
}

// The statements of the Inspector, built per table like those of the store.
func lookupQuery(table string) string {
	return fmt.Sprintf(`SELECT state, token, endpoint, fingerprint, status, headers, body, truncated, created_at, expires_at
FROM %s WHERE key = $1 AND expires_at > now()`, table)
}

func deleteQuery(table string) string {
	return fmt.Sprintf(`DELETE FROM %s WHERE key = $1 RETURNING expires_at > now()`, table)
}

// inFlightQuery reads no body or headers. The DDL's partial index on
// created_at WHERE state = 'in_progress' serves it (tables created before
// that index existed scan their live rows instead).
func inFlightQuery(table string) string {
	return fmt.Sprintf(`SELECT key, endpoint, created_at, expires_at FROM %s
WHERE state = 'in_progress' AND expires_at > now() AND created_at <= now() - $1::bigint * interval '1 microsecond'
ORDER BY created_at, key LIMIT $2`, table)
}

// Lookup reads key's live row, with its expiry from the database's clock.
func (s *Store) Lookup(ctx context.Context, key store.Key) (*store.Record, time.Time, error) {
	if err := s.db.ensure(ctx); err != nil {
		return nil, time.Time{}, err
	}
	var (
		state, endpoint                   string
		token, fingerprint, headers, body []byte
		status                            int32
		truncated                         bool
		created, expires                  time.Time
	)
	err := s.db.pool.QueryRow(ctx, lookupQuery(s.db.qualified), key[:]).
		Scan(&state, &token, &endpoint, &fingerprint, &status, &headers, &body, &truncated, &created, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, s.unavailable("looking up", err)
	}
	rec := &store.Record{Endpoint: endpoint, CreatedAt: created, Status: int(status), Body: body, Truncated: truncated}
	if rec.State, err = parseState(state); err != nil {
		return nil, time.Time{}, s.unavailable("decoding record", err)
	}
	if len(token) != len(rec.Token) || len(fingerprint) != len(rec.Fingerprint) {
		return nil, time.Time{}, s.unavailable("decoding record", errors.New("token or fingerprint of the wrong size"))
	}
	copy(rec.Token[:], token)
	copy(rec.Fingerprint[:], fingerprint)
	if headers != nil {
		if err := json.Unmarshal(headers, &rec.Header); err != nil {
			return nil, time.Time{}, s.unavailable("decoding headers", err)
		}
	}
	return rec, expires, nil
}

// Delete deletes key's row, whoever owns it, expired or not, and reports
// whether it was live.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	if err := s.db.ensure(ctx); err != nil {
		return false, err
	}
	var wasLive bool
	err := s.db.pool.QueryRow(ctx, deleteQuery(s.db.qualified), key[:]).Scan(&wasLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.unavailable("deleting", err)
	}
	return wasLive, nil
}

// InFlight lists the oldest in-progress claims in one statement.
func (s *Store) InFlight(ctx context.Context, olderThan time.Duration, limit int) ([]store.Entry, error) {
	if limit <= 0 {
		return nil, nil
	}
	if err := s.db.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := s.db.pool.Query(ctx, inFlightQuery(s.db.qualified), max(olderThan, 0).Microseconds(), limit)
	if err != nil {
		return nil, s.unavailable("listing claims", err)
	}
	var out []store.Entry
	for rows.Next() {
		var key []byte
		e := store.Entry{Summary: store.Summary{State: store.InProgress}}
		if err := rows.Scan(&key, &e.Endpoint, &e.CreatedAt, &e.ExpiresAt); err != nil {
			rows.Close()
			return nil, s.unavailable("listing claims", err)
		}
		if len(key) != len(e.Key) {
			continue
		}
		copy(e.Key[:], key)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.unavailable("listing claims", err)
	}
	return store.SortEntries(out, limit), nil
}

func parseState(s string) (store.State, error) {
	switch s {
	case "in_progress":
		return store.InProgress, nil
	case "completed":
		return store.Completed, nil
	}
	return 0, fmt.Errorf("unknown state %q", s)
}

var _ store.Inspector = (*Store)(nil)
