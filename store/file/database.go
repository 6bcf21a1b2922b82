package file

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

const (
	// lockTimeout makes bbolt try the lock on the file once, and not wait:
	// only another process holds it (lockedFile), and will not let go soon.
	// bbolt tries, then gives up unless less than its retry interval
	// (50ms) has passed.
	lockTimeout = time.Nanosecond

	// sweepBatch and sweepScan bound the deletions and reads of one write
	// transaction, so that the sweeper never holds the writer lock long.
	sweepBatch = 1000
	sweepScan  = 10 * sweepBatch
)

// sweepInterval is a variable for tests; each database reads it once.
var sweepInterval = time.Minute

// database is one open file, its claims (and their journal, beside it) and
// its sweeper, shared by every config that uses it.
type database struct {
	*bolt.DB
	claims   *claims
	writes   groupCommit // the completions; the sweeper and the admin API use Update
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
	// Opened under bbolt's lock, which is the journal's too.
	logPath := filepath.Join(filepath.Dir(path), journalName)
	claims, torn, err := loadClaims(db, logPath)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("reading the claims in %s: %w", logPath, err)
	}
	if torn > 0 {
		logger.Warn("the end of the idempotency claims journal was torn (by a crash of the system?) and is ignored; claims made just before it may be lost",
			zap.String("path", logPath), zap.Int("bytes", torn))
	}
	if n := len(claims.byKey); n > 0 {
		logger.Info("claims left by the process that had the file open before hold their keys until their lease passes, then are taken over as a dead owner's until their ttl has passed too",
			zap.String("path", logPath), zap.Int("claims", n))
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &database{DB: db, claims: claims, writes: groupCommit{db: db}, logger: logger, interval: sweepInterval, stop: stop, done: make(chan struct{})}
	go d.run(ctx)
	return d, nil
}

// Destruct stops the sweeper and closes the file and the journal, which
// keeps the claims of requests still running (cut off by the stop) for
// the next process. bbolt's Close waits for running transactions.
func (d *database) Destruct() error {
	err := d.claims.close()
	d.stop()
	<-d.done
	return errors.Join(d.Close(), err)
}

// run deletes expired records and claims every interval until Destruct,
// only to bound the file and memory: they are already treated as absent;
// and compacts the claims' journal when it is due.
func (d *database) run(ctx context.Context) {
	defer close(d.done)
	tick := time.NewTicker(d.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.claims.log.due:
			if err := d.claims.compact(); err != nil {
				d.logger.Warn("rewriting the idempotency claims journal", zap.Error(err))
			}
			continue
		case <-tick.C:
		}
		if err := d.claims.sweep(now()); err != nil {
			d.logger.Warn("dropping expired idempotency claims", zap.Error(err))
		}
		n, err := d.sweep(ctx, sweepBatch, nil)
		if err != nil && ctx.Err() == nil {
			d.logger.Warn("deleting expired idempotency records", zap.Int("deleted", n), zap.Error(err))
		}
	}
}

// sweep deletes expired records, batch at most per transaction, through
// the file. afterBatch, if set, runs after each transaction (for tests).
func (d *database) sweep(ctx context.Context, batch int, afterBatch func()) (deleted int, err error) {
	var from []byte // nil: the first key, as every key sorts after it
	for ctx.Err() == nil {
		var n int
		err := d.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(records)
			c := b.Cursor()
			// Deleting while iterating can make a bbolt cursor skip a key,
			// so collect first and delete after.
			var expired [][]byte
			t := now()
			k, v := c.Seek(from)
			for scanned := 0; k != nil && len(expired) < batch && scanned < sweepScan; scanned++ {
				if !live(v, t) {
					expired = append(expired, append([]byte(nil), k...))
				}
				k, v = c.Next()
			}
			from = append([]byte(nil), k...) // nil at the end of the bucket
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
		if from == nil {
			return deleted, nil
		}
	}
	return deleted, ctx.Err()
}
