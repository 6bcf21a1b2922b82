// Package file is the on-disk idempotency store: a bbolt database in one
// file, for a single Caddy instance that must keep its records across
// restarts and crashes without running a database server. Every store call
// is one bbolt transaction, and bbolt syncs each write to disk before it
// returns, so a completed record survives a kill of the process.
package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddy.RegisterModule(Store{})
}

const (
	fileName = "idempotency.db"
	// lockTimeout bounds the wait for bbolt's exclusive lock on the file.
	// Within this process the database is shared, so the lock is only ever
	// held by another process, which will not let go soon: fail quickly.
	lockTimeout = time.Second

	// sweepBatch bounds the deletions of one write transaction, and
	// sweepScan the records it reads, so that the sweeper never holds the
	// single writer lock long enough to delay a request.
	sweepBatch = 1000
	sweepScan  = 10 * sweepBatch
)

// sweepInterval is a variable for tests; each database reads it once.
var sweepInterval = time.Minute

// records is the one bucket, keyed by the 32-byte store.Key.
var records = []byte("records")

// Store keeps idempotency records in a file on local disk. The file is
// locked by the Caddy process that opens it, so it cannot be shared by
// several instances.
type Store struct {
	// Path is the directory that holds the database file, idempotency.db;
	// it is created if missing. Placeholders such as {env.STATE_DIR} are
	// resolved at provisioning. Default: the idempotency directory in
	// Caddy's data directory.
	Path string `json:"path,omitempty"`

	dir     string // absolute, resolved at provisioning
	poolKey string
	name    string // in the store registry
	db      *database
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.file",
		New: func() caddy.Module { return new(Store) },
	}
}

// databases keeps each open file across config reloads. Caddy provisions
// the new config before it cleans up the old one, and bbolt's lock would
// make the new config wait for a file that the old one holds open.
var databases = caddy.NewUsagePool()

// Provision resolves the path and opens the database, or attaches to the
// copy that an earlier config opened. It fails if another process holds
// the file.
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
	s.dir = dir
	s.poolKey = "file:" + filepath.Join(dir, fileName)
	val, _, err := databases.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		return openDatabase(filepath.Join(dir, fileName), ctx.Logger())
	})
	if err != nil {
		s.poolKey = ""
		return err
	}
	s.db = val.(*database)
	s.name = registryName(filepath.Join(dir, fileName))
	store.Register(s.name, s)
	return nil
}

// Validate checks that the store was provisioned.
func (s *Store) Validate() error {
	if s.db == nil {
		return errors.New("file store is not provisioned")
	}
	return nil
}

// Cleanup gives the database back; the last user closes the file. It is
// safe to call more than once. The store keeps its handle, so calls made
// after the file is closed fail with store.ErrUnavailable.
func (s *Store) Cleanup() error {
	if s == nil {
		return nil
	}
	if err := store.Detach(s, s.name, databases, &s.poolKey); err != nil {
		return fmt.Errorf("closing idempotency database: %w", err)
	}
	return nil
}

// database is one open file and its sweeper, shared by every config that
// uses it.
type database struct {
	*bolt.DB
	writes   groupCommit // the store's writes; the sweeper and the admin API use Update
	logger   *zap.Logger
	interval time.Duration
	stop     context.CancelFunc
	done     chan struct{}
}

func openDatabase(path string, logger *zap.Logger) (*database, error) {
	// NoSync stays false: a commit returns only once the file is synced.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("opening %s: another process holds its lock (is a second Caddy using the same path?): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(records)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("creating bucket in %s: %w", path, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &database{DB: db, writes: groupCommit{db: db}, logger: logger, interval: sweepInterval, stop: stop, done: make(chan struct{})}
	go d.run(ctx)
	return d, nil
}

// Destruct stops the sweeper and closes the file when the last config
// using it is gone. bbolt's Close waits for running transactions.
func (d *database) Destruct() error {
	d.stop()
	<-d.done
	return d.Close()
}

// run deletes expired records every interval until Destruct. They
// are already treated as absent; sweeping only bounds the file's size.
func (d *database) run(ctx context.Context) {
	defer close(d.done)
	tick := time.NewTicker(d.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := d.sweep(ctx, sweepBatch, nil)
		if err != nil && ctx.Err() == nil {
			d.logger.Warn("deleting expired idempotency records", zap.Int("deleted", n), zap.Error(err))
		}
	}
}

// sweep deletes expired records, batch at most per transaction, until it
// has been through the whole file or ctx is done. afterBatch, if set, runs
// after each transaction (tests count them).
func (d *database) sweep(ctx context.Context, batch int, afterBatch func()) (deleted int, err error) {
	var from []byte
	for ctx.Err() == nil {
		var next []byte
		var n int
		err := d.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(records)
			c := b.Cursor()
			k, v := c.First()
			if from != nil {
				k, v = c.Seek(from)
			}
			// Deleting while iterating can make a bbolt cursor skip a key,
			// so collect first and delete after.
			var expired [][]byte
			t := now()
			for scanned := 0; k != nil && len(expired) < batch && scanned < sweepScan; scanned++ {
				if !live(v, t) {
					expired = append(expired, append([]byte(nil), k...))
				}
				k, v = c.Next()
			}
			next = append([]byte(nil), k...) // nil at the end of the bucket
			for _, k := range expired {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			n = len(expired)
			return nil
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
		if afterBatch != nil {
			afterBatch()
		}
		if len(next) == 0 {
			return deleted, nil
		}
		from = next
	}
	return deleted, ctx.Err()
}

// Interface guards
var (
	_ store.Store        = (*Store)(nil)
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.Validator    = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
)
