package file

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// A claim whose lease has passed is a dead owner's. It is kept as long
// again as its record would have been (Claim.TTL), so that a retry within
// the TTL, even after a restart and any number of sweeps, is told that it
// takes a dead owner's claim over (store.Acquired.TookOver), and with
// Claim.KeepUnknown is answered as the dead request's unknown outcome
// rather than run again. Then it is gone, as if never made.

// defaultKeep stands for a TTL the caller left out: the handler's default
// ttl.
const defaultKeep = 24 * time.Hour

// keepOf is how long past its lease c's claim is kept for a dead owner.
func keepOf(c *store.Claim) time.Duration {
	if c.TTL <= 0 {
		return defaultKeep
	}
	return c.TTL
}

// gone reports whether e is kept no longer at n: its lease and its keep
// have passed, and no completion holds it. A keep too long to add to the
// lease end never passes.
func (e *held) gone(n int64) bool {
	until := e.expires + int64(e.keep)
	return !e.storing && until >= e.expires && n >= until
}

// inherit makes e, c's claim, the heir of dead, a dead owner's claim, for
// Claim.KeepUnknown: bound as dead was (its endpoint, fingerprint and
// creation time), and pinned so that nothing takes it over, releases it or
// completes it while database.keepUnknown ends it.
func (e *held) inherit(dead *held, c *store.Claim) error {
	rec, err := store.DecodeRecord(dead.blob)
	if err != nil {
		return fmt.Errorf("decoding a dead owner's claim: %w", err)
	}
	heir := &store.Claim{Token: c.Token, Endpoint: rec.Endpoint, Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt}
	e.blob, e.storing = store.AppendClaim(nil, heir), true
	return nil
}

// keepUnknown completes heir, the claim that c took of key from a dead
// owner (claims.take), as the dead request's unknown outcome, kept for
// c's TTL, through the synced write of a completion. It returns the record
// and TookOver, or the write's error: then the heir's claim stays, bound as
// the dead one was, and is a dead owner's once its lease has passed.
// store.ErrNotOwner: an operator purged the key meanwhile.
func (d *database) keepUnknown(key store.Key, c *store.Claim, heir *held) (store.Acquired, error) {
	rec, err := store.DecodeRecord(heir.blob)
	if err == nil {
		rec.State, rec.OutcomeUnknown = store.Completed, true
		err = d.writes.update(func(tx *bolt.Tx) error {
			if err := d.claims.still(key, heir); err != nil {
				return err
			}
			rec.ExpiresAt = now().Add(keepOf(c))
			return tx.Bucket(records).Put(key[:], store.AppendRecord(nil, rec))
		})
	}
	d.claims.settle(key, heir, err == nil)
	if err != nil {
		return store.Acquired{}, err
	}
	return store.Acquired{Record: rec, TookOver: true}, nil
}

// still fails unless e is k's claim: an operator may have purged it.
func (cs *claims) still(k store.Key, e *held) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	switch {
	case cs.closed:
		return errClosed
	case cs.byKey[k] != e:
		return store.ErrNotOwner
	}
	return nil
}
