package postgres

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// defaultName names the table: server, database, schema and table, never
// the user or password, as in
// "postgres 127.0.0.1:5432/app public.idempotency_keys".
func defaultName(cfg *pgxpool.Config, schema, table string) string {
	name := table
	if schema == "" {
		// A DSN that sets search_path may mean another table of that name.
		schema = cfg.ConnConfig.RuntimeParams["search_path"]
	}
	if schema != "" {
		name = schema + "." + table
	}
	host := cfg.ConnConfig.Host + ":" + strconv.Itoa(int(cfg.ConnConfig.Port))
	return "postgres " + host + "/" + cfg.ConnConfig.Database + " " + name
}

// Lookup reads key's live row, with its expiry from the database's clock.
func (s *Store) Lookup(ctx context.Context, key store.Key) (*store.Record, time.Time, error) {
	if err := s.db.ensure(ctx); err != nil {
		return nil, time.Time{}, err
	}
	r := new(row)
	err := s.db.pool.QueryRow(ctx, s.db.q.lookup, key[:]).Scan(r.dests(&r.expires)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, s.unavailable("looking up", err)
	}
	rec, err := r.record(r.expires)
	if err != nil {
		return nil, time.Time{}, s.unavailable("looking up", err)
	}
	return rec, r.expires, nil
}

// Delete deletes key's row, whoever owns it, and reports whether it was
// live. The statement notifies the purge; this instance's tier drops it.
func (s *Store) Delete(ctx context.Context, key store.Key) (bool, error) {
	if err := s.db.ensure(ctx); err != nil {
		return false, err
	}
	var wasLive bool
	err := s.db.pool.QueryRow(ctx, s.db.q.delete, key[:]).Scan(&wasLive, nil)
	if s.tier != nil {
		s.tier.Delete(key)
	}
	if err != nil { // the statement always returns a row
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
	// pgx defers an error of Query to the rows.
	rows, _ := s.db.pool.Query(ctx, s.db.q.inFlight, max(olderThan, 0).Microseconds(), limit)
	var out []store.Entry
	var key []byte
	e := store.Entry{Summary: store.Summary{State: store.InProgress}}
	_, err := pgx.ForEachRow(rows, []any{&key, (*endpointColumn)(&e.Endpoint), &e.CreatedAt, &e.ExpiresAt}, func() error {
		if len(key) == len(e.Key) {
			copy(e.Key[:], key)
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, s.unavailable("listing claims", err)
	}
	return store.SortEntries(out, limit), nil
}

var _ store.Inspector = (*Store)(nil)
