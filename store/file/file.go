// Package file is the on-disk idempotency store: a bbolt database in one
// file, for a single Caddy instance that must keep its records across
// restarts and crashes. A completion is one bbolt transaction, synced
// before it returns. Claims are kept in memory (claims.go), as the file's
// lock gives one process its keys, and in a journal without fsync
// (journal.go), for the process that opens the file after one that died.
package file

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddy.RegisterModule(Store{})
}

const fileName = "idempotency.db"

// Store keeps idempotency records in a file on local disk. The file is
// locked by the Caddy process that opens it, so it cannot be shared by
// several instances.
type Store struct {
	// Name is what operators call the store: `caddy idempotency stores`
	// lists it, the admin API's store= and the command's --store choose
	// it, and the metrics and traces carry it. Within one config, every
	// store block for the same directory must have the same name, and
	// different directories different names. Default: the directory, as
	// in "file /var/lib/caddy/idempotency".
	Name string `json:"name,omitempty"`

	// Path is the directory that holds the database file, idempotency.db;
	// it is created if missing. Placeholders such as {env.STATE_DIR} are
	// resolved at provisioning. Default: the idempotency directory in
	// Caddy's data directory.
	Path string `json:"path,omitempty"`

	poolKey string
	name    string // in the store registry
	file    *lockedFile
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.file",
		New: func() caddy.Module { return new(Store) },
	}
}

// databases keeps each open file across config reloads: Caddy provisions
// the new config before it cleans up the old, and bbolt's lock would keep
// the file from the new one.
var databases = caddy.NewUsagePool()

// Provision resolves the path and opens the database, or attaches to the
// one an earlier config opened. While another process holds the file's
// lock (caddy validate beside a running Caddy), it checks the path and
// leaves the file unopened (lockedFile).
func (s *Store) Provision(ctx caddy.Context) error {
	dir := caddy.NewReplacer().ReplaceKnown(s.Path, "")
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "idempotency")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating directory: %w", err)
	}
	// One file must get one pool key however the path is spelled.
	dir, err := filepath.Abs(dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil {
		return fmt.Errorf("resolving path: %w", err)
	}
	s.poolKey = "file:" + filepath.Join(dir, fileName)
	val, _, err := databases.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		return openLockedFile(filepath.Join(dir, fileName), ctx.Logger())
	})
	if err != nil {
		s.poolKey = ""
		return err
	}
	s.file = val.(*lockedFile)
	records := defaultName(dir)
	s.name = cmp.Or(s.Name, records)
	// On error, Caddy's call of Cleanup gives the database back.
	return store.Register(ctx.Context, store.Registration{Name: s.name, Module: "file", Store: s}, records)
}

// Validate checks that the store was provisioned.
func (s *Store) Validate() error {
	if s.file == nil {
		return errors.New("file store is not provisioned")
	}
	return nil
}

// Cleanup gives the database back; the last user closes the file once the
// requests that hold this store are done (store.Holds), after which calls
// fail with store.ErrUnavailable. It is safe to call more than once.
func (s *Store) Cleanup() error {
	if s == nil {
		return nil
	}
	if err := store.Detach(s, s.name, databases, &s.poolKey); err != nil {
		return fmt.Errorf("closing idempotency database: %w", err)
	}
	return nil
}

// open returns the open database, or why there is none: another process
// holds the file's lock, or the file is closed.
func (s *Store) open(op string) (*database, error) {
	db, err := s.file.open()
	if err != nil {
		return nil, store.Unavailable(op, err)
	}
	return db, nil
}

// Interface guards
var (
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.Validator    = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
)
