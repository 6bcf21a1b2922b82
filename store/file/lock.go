package file

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

// lockedFile is what the pool keeps for one database file: the open
// database, or nothing yet while another process holds the file's lock.
//
// caddy validate provisions the config in a process of its own, beside the
// running Caddy that holds the lock: a Provision that needed the lock
// would fail the usual validate-then-reload deploy step. So Provision
// takes the lock only if it is free. Otherwise it checks what a bad path
// fails (the file and its directory take writes) and provisions the store
// unopened: each call tries the lock once more, without waiting, and fails
// as the store's outage does until it gets it. A second Caddy on the same
// path so starts, and answers from the file only once the first lets go;
// it never touches the file or the journal before.
type lockedFile struct {
	path   string
	logger *zap.Logger
	db     atomic.Pointer[database] // set once opened

	mu     sync.Mutex // held by the one opening the file, and by Destruct
	closed bool
}

// openLockedFile opens the database at path, or, if another process holds
// its lock, checks that the file and its directory take writes and leaves
// it unopened.
func openLockedFile(path string, logger *zap.Logger) (*lockedFile, error) {
	f := &lockedFile{path: path, logger: logger}
	db, err := openDatabase(path, logger)
	switch {
	case err == nil:
		f.db.Store(db)
	case !errors.Is(err, berrors.ErrTimeout):
		return nil, err
	default:
		if err := writable(path); err != nil {
			return nil, err
		}
		logger.Warn("another process holds the lock of the idempotency database: the store answers as unavailable until it lets go (as expected in caddy validate beside the Caddy that runs on it; otherwise, is a second Caddy using the same path?)",
			zap.String("path", path))
	}
	return f, nil
}

// open returns the database, opening it if the lock has become free.
func (f *lockedFile) open() (*database, error) {
	if db := f.db.Load(); db != nil {
		return db, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if db := f.db.Load(); db != nil {
		return db, nil
	}
	if f.closed {
		return nil, errClosed
	}
	db, err := openDatabase(f.path, f.logger)
	if err != nil {
		return nil, err
	}
	f.logger.Info("the process that held the lock of the idempotency database let go: the store is open", zap.String("path", f.path))
	f.db.Store(db)
	return db, nil
}

// Destruct closes the database, if it was opened; later calls fail.
func (f *lockedFile) Destruct() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if db := f.db.Load(); db != nil {
		return db.Destruct()
	}
	return nil
}

// writable checks, without the lock, what opening the file would: that
// the file and the journal, where they exist, open for writing, and that
// their directory takes new files (the journal's compaction writes one).
func writable(path string) error {
	dir := filepath.Dir(path)
	for _, p := range []string{path, filepath.Join(dir, journalName)} {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("opening %s: %w", p, err)
		}
		f.Close()
	}
	probe, err := os.CreateTemp(dir, ".writable-*")
	if err != nil {
		return fmt.Errorf("directory %s does not take new files: %w", dir, err)
	}
	probe.Close()
	return os.Remove(probe.Name())
}
