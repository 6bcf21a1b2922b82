// Package postgres is the PostgreSQL backend of the idempotency handler.
// The primary key of one table makes "first writer wins" atomic, and every
// owner-checked call is one statement. Leases and TTLs run by the
// database's clock, so instances with skewed clocks agree on them.
package postgres

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/tier"
)

func init() {
	caddy.RegisterModule(Store{})
}

const (
	defaultTable = "idempotency_keys"
	// defaultConnectTimeout bounds opening a connection when the DSN sets
	// no connect_timeout, even for a request context without a deadline.
	defaultConnectTimeout = 2 * time.Second
	// maxIdentifier is PostgreSQL's NAMEDATALEN-1: longer names would be
	// silently truncated, and two tables could end up sharing one.
	maxIdentifier = 63
)

// Store keeps idempotency records in a PostgreSQL table, so that every Caddy
// instance that uses the same database shares them.
type Store struct {
	// Name is what operators call the store: `caddy idempotency stores`
	// lists it, the admin API's store= and the command's --store choose
	// it, and the metrics and traces carry it. Within one config, every
	// store block for the same table must have the same name, and
	// different tables different names. Default: the server, database and
	// table, as in "postgres 127.0.0.1:5432/app idempotency_keys".
	Name string `json:"name,omitempty"`

	// DSN is the connection string, as a URL
	// (postgres://user:password@host:5432/db?sslmode=verify-full) or as
	// keyword=value pairs. Use a placeholder such as {env.DATABASE_URL} to
	// keep the password out of the configuration. pgx settings such as
	// pool_max_conns or default_query_exec_mode may be given in it. Required.
	DSN string `json:"dsn,omitempty"`

	// Table is the name of the table that holds the records.
	// Default: idempotency_keys.
	Table string `json:"table,omitempty"`

	// Schema is the schema of the table, which must exist. Default: the
	// first schema of the connection's search_path, usually public.
	Schema string `json:"schema,omitempty"`

	// MaxConns bounds the connections of this store's pool. The connection
	// that listens to the other instances' notifications, once a duplicate
	// waits or local_cache is set, is one more. Default: pool_max_conns
	// from the DSN, else the greater of 4 and the number of CPUs.
	MaxConns int `json:"max_conns,omitempty"`

	// CreateTable creates the table and its indexes when they are missing,
	// at the first use of the database. Turn it off when migrations manage
	// the schema; DDL prints the statements to run. Default: true.
	CreateTable *bool `json:"create_table,omitempty"`

	// LocalCache is the size in bytes of this instance's local tier: a copy
	// of the completed records it has seen, replayed without a statement,
	// each until its expiry, the oldest evicted first when full. Purges on
	// any instance reach it over LISTEN/NOTIFY; while that connection is
	// down it is emptied and unused. Default: 0, no local tier.
	LocalCache int64 `json:"local_cache,omitempty"`

	// SynchronousCommit is the synchronous_commit setting of the store's
	// connections: on, off, local, remote_write or remote_apply. With
	// synchronous_standby_names set on the server, remote_write (or
	// remote_apply) makes a claim and a completion wait until a
	// synchronous standby has them, so that a failover to that standby
	// loses neither; without it, every level but off waits for the local
	// disk only. Default: the server's (on unless configured otherwise).
	SynchronousCommit string `json:"synchronous_commit,omitempty"`

	// Pipelining sends the claims, completions, releases, renewals and
	// watches that arrive while every pooled connection (max_conns) is
	// busy together, once one frees: one round trip and one transaction,
	// so one commit, for all of them. A statement that finds a connection
	// free goes at once, alone, as with pipelining off; a batch holds at
	// most 16 statements and takes its rows in key order; a statement that
	// fails runs again alone, so its failure is its own. Off, every
	// statement waits for a connection of its own. Default: true.
	Pipelining *bool `json:"pipelining,omitempty"`

	// Resolved at provisioning; the exported fields keep what was written.
	dsn     string
	schema  string
	table   string
	poolKey string
	name    string // in the store registry
	db      *database
	tier    *tier.Cache // nil without local_cache
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.postgres",
		New: func() caddy.Module { return new(Store) },
	}
}

// synchronousCommitLevels are the values of synchronous_commit, "" for
// the server's.
var synchronousCommitLevels = []string{"", "on", "off", "local", "remote_write", "remote_apply"}

// databases lets every config that asks for the same table share one pool
// and reaper, so a reload neither drops nor doubles connections.
var databases = caddy.NewUsagePool()

// Provision resolves placeholders, applies defaults and gets a connection
// pool. It does not contact PostgreSQL, so that Caddy starts while it is
// down.
func (s *Store) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	s.dsn = repl.ReplaceKnown(s.DSN, "")
	s.schema = repl.ReplaceKnown(s.Schema, "")
	s.table = cmp.Or(repl.ReplaceKnown(s.Table, ""), defaultTable)
	if err := s.Validate(); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(s.dsn)
	if err != nil {
		return dsnError(s.dsn, err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	if s.MaxConns > 0 {
		cfg.MaxConns = int32(s.MaxConns)
	}
	if s.SynchronousCommit != "" {
		// A startup parameter: no cost per statement.
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = s.SynchronousCommit
	}
	create := s.CreateTable == nil || *s.CreateTable
	pipelining := s.Pipelining == nil || *s.Pipelining
	losses, err := store.SubscriptionLosses(ctx.GetMetricsRegistry())
	if err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}

	s.poolKey = s.databaseKey(create, pipelining)
	val, _, err := databases.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		return newDatabase(cfg, s.schema, s.table, create, pipelining, losses, s.logger)
	})
	if err != nil {
		s.poolKey = ""
		return fmt.Errorf("creating postgres pool: %w", err)
	}
	s.db = val.(*database)
	records := defaultName(cfg, s.schema, s.table)
	s.name = cmp.Or(s.Name, records)
	s.tier = s.db.events.join(s.LocalCache, s.name)
	// On error, Caddy's call of Cleanup gives the pool back.
	return store.Register(ctx.Context, store.Registration{Name: s.name, Module: "postgres", Store: s}, records)
}

// databaseKey identifies the pool options without revealing them: the DSN
// holds the password, so it is part of the key only through a hash.
func (s *Store) databaseKey(create, pipelining bool) string {
	b, _ := json.Marshal([]any{s.dsn, s.schema, s.table, s.MaxConns, create, s.SynchronousCommit, pipelining})
	sum := sha256.Sum256(b)
	return "postgres:" + hex.EncodeToString(sum[:])
}

// Validate checks the provisioned configuration.
func (s *Store) Validate() error {
	switch {
	case s.table == "":
		return errors.New("postgres store is not provisioned")
	case s.dsn == "":
		return errors.New("dsn is required (an unset environment variable resolves to empty)")
	case len(s.table) > maxIdentifier:
		return fmt.Errorf("table '%s' is longer than %d bytes", s.table, maxIdentifier)
	case len(s.schema) > maxIdentifier:
		return fmt.Errorf("schema '%s' is longer than %d bytes", s.schema, maxIdentifier)
	case s.MaxConns < 0 || s.MaxConns > math.MaxInt32:
		return fmt.Errorf("max_conns %d is out of range", s.MaxConns)
	case s.LocalCache < 0:
		return fmt.Errorf("local_cache %d is negative", s.LocalCache)
	case !slices.Contains(synchronousCommitLevels, s.SynchronousCommit):
		return fmt.Errorf("synchronous_commit '%s' is not one of %s", s.SynchronousCommit, strings.Join(synchronousCommitLevels[1:], ", "))
	}
	return nil
}

// Cleanup gives the pool back; its last user closes it once the requests
// that hold this store are done (store.Holds). It is safe to call more
// than once.
func (s *Store) Cleanup() error {
	if s == nil {
		return nil
	}
	if s.poolKey != "" {
		s.db.events.leave(s.LocalCache, s.name)
	}
	if err := store.Detach(s, s.name, databases, &s.poolKey); err != nil {
		return fmt.Errorf("closing postgres pool: %w", err)
	}
	return nil
}

// String describes the store for logs, with the DSN's password redacted.
// It has a value receiver so that printing a Store value is redacted too.
func (s Store) String() string {
	create := s.CreateTable == nil || *s.CreateTable
	return fmt.Sprintf("postgres{name=%q dsn=%q schema=%q table=%q max_conns=%d create_table=%t local_cache=%d synchronous_commit=%q pipelining=%t}",
		s.Name, redactDSN(s.DSN), s.Schema, s.Table, s.MaxConns, create, s.LocalCache, s.SynchronousCommit, s.Pipelining == nil || *s.Pipelining)
}

// GoString keeps %#v from printing the password.
func (s Store) GoString() string { return s.String() }

// Interface guards
var (
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.Validator    = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
)
