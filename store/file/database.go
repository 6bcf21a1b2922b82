package file

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

const (
	// lockTimeout bounds the wait for bbolt's lock on the file, which only
	// another process holds, and will not let go soon.
	lockTimeout = time.Second

	// sweepBatch and sweepScan bound the deletions and reads of one write
	// transaction, so that the sweeper never holds the writer lock long.
	sweepBatch = 1000
	sweepScan  = 10 * sweepBatch
)

// sweepInterval is a variable for tests; each database reads it once.
var sweepInterval = time.Minute

// database is one open file, its claims and its sweeper, shared by every
// config that uses it.
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
	ctx, stop := context.WithCancel(context.Background())
	d := &database{DB: db, claims: newClaims(), writes: groupCommit{db: db}, logger: logger, interval: sweepInterval, stop: stop, done: make(chan struct{})}
	go d.run(ctx)
	return d, nil
}

// Destruct stops the sweeper and closes the file. bbolt's Close waits for
// running transactions.
func (d *database) Destruct() error {
	d.claims.close()
	d.stop()
	<-d.done
	return d.Close()
}

// run deletes expired records and claims every interval until Destruct,
// only to bound the file and memory: they are already treated as absent.
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
		d.claims.sweep(now())
		n, err := d.sweep(ctx, sweepBatch, nil)
		if err != nil && ctx.Err() == nil {
			d.logger.Warn("deleting expired idempotency records", zap.Int("deleted", n), zap.Error(err))
		}
	}
}

// sweep deletes expired records, batch at most per transaction, through
// the file. afterBatch, if set, runs after each transaction (for tests).
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
