package file

import (
	"sync"
	"sync/atomic"
	"time"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// claims are the keys in flight: one claim per request that runs in this
// process. They are kept in memory only, so that a new key costs one synced
// write, its completion, rather than two. The file's lock makes this
// process the only one that claims its keys, so memory is where every
// claim of the file is. A crash forgets them, which the guarantees allow:
// whatever ran when the process died may run once more, and now a retry
// after a restart runs at once instead of after the lease.
//
// An owner's completion is committed to the file before its claim is
// dropped from here, so that a claim is never missing from both; Acquire
// relies on that order.
//
// That order alone does not make Acquire's read of the file and its claim
// here one step: a duplicate that read the file before a completion was
// committed, and claims after its claim was dropped, would hold a claim on
// a completed key, one that other duplicates would be shown as the key's
// record. So each committed completion counts itself in settled, under the
// lock, as it drops its claim, and take refuses to claim if the count for
// the key's shard has changed since the caller read it, before its read of
// the file: the caller reads the file again, and finds the completion.
type claims struct {
	mu      sync.Mutex
	byKey   map[store.Key]*held
	closed  bool // the file is closed: every call fails as the file's would
	settled [settledShards]atomic.Uint64
}

// settledShards is how many counts of committed completions claims keeps,
// a key's shard being its first byte (keys are SHA-256 sums): a completion
// makes Acquire read the file again only for keys of its shard.
const settledShards = 256

// generation returns the count of committed completions of k's shard, to
// be read before the file and given to take.
func (cs *claims) generation(k store.Key) uint64 { return cs.settled[k[0]].Load() }

// held is one claim.
type held struct {
	// blob is the claim's record in the shared codec; never written once
	// built, so that it may be decoded outside the lock.
	blob store.Encoded
	// expires is the end of the lease, in Unix nanoseconds.
	expires int64
	// storing is set while the owner's completion is being committed: the
	// claim holds whatever its lease says, and cannot be taken over,
	// released or completed a second time, until the commit has ended.
	storing bool
}

func newClaims() *claims { return &claims{byKey: make(map[store.Key]*held)} }

// errClosed is what bbolt answers once the file is closed.
var errClosed = berrors.ErrDatabaseNotOpen

// alive reports whether e holds its key at n: its lease has not passed, or
// its completion is being committed.
func (e *held) alive(n int64) bool { return e.storing || n < e.expires }

// take claims k for c at t unless it is held, in which case it returns the
// holder's record. tookOver is whether the claim replaced one whose lease
// had passed. gen is what generation returned before the caller read the
// file; stale reports that a completion of k's shard has been committed
// since, which that read may have missed: nothing is claimed, and the
// caller must read the file again.
func (cs *claims) take(k store.Key, c *store.Claim, t time.Time, gen uint64) (holder store.Encoded, tookOver, stale bool, err error) {
	blob := store.AppendClaim(nil, c) // outside the lock: it needs nothing from it
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, false, false, errClosed
	}
	old := cs.byKey[k]
	if old != nil && old.alive(t.UnixNano()) {
		return old.blob, false, false, nil
	}
	if cs.settled[k[0]].Load() != gen {
		return nil, false, true, nil
	}
	cs.byKey[k] = &held{blob: blob, expires: t.Add(c.Lease).UnixNano()}
	return nil, old != nil, false, nil
}

// owned returns k's claim if tok holds it at n. The caller holds the lock.
func (cs *claims) owned(k store.Key, tok store.Token, n int64) (*held, error) {
	if cs.closed {
		return nil, errClosed
	}
	e := cs.byKey[k]
	if e == nil || n >= e.expires || !e.blob.ClaimedBy(tok) {
		return nil, store.ErrNotOwner
	}
	return e, nil
}

// release removes the claim held by tok.
func (cs *claims) release(k store.Key, tok store.Token, t time.Time) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, err := cs.owned(k, tok, t.UnixNano())
	if err != nil {
		return err
	}
	if e.storing {
		return store.ErrNotOwner // the completion under way takes it
	}
	delete(cs.byKey, k)
	return nil
}

// renew sets the lease of the claim held by tok to lease from t.
func (cs *claims) renew(k store.Key, tok store.Token, lease time.Duration, t time.Time) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, err := cs.owned(k, tok, t.UnixNano())
	if err != nil {
		return err
	}
	e.expires = t.Add(lease).UnixNano()
	return nil
}

// pin marks the claim held by tok as being completed, so that nothing
// takes it while its completion is committed; settle ends that.
func (cs *claims) pin(k store.Key, tok store.Token, t time.Time) (*held, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e, err := cs.owned(k, tok, t.UnixNano())
	if err != nil {
		return nil, err
	}
	if e.storing {
		return nil, store.ErrNotOwner // another completion by the same owner is under way
	}
	e.storing = true
	return e, nil
}

// settle ends the completion of e: a committed one drops the claim, which
// the record in the file replaces, and counts itself for take; a failed one
// leaves the claim to its owner, who may try again while its lease lasts.
// An operator may have removed e meanwhile.
func (cs *claims) settle(k store.Key, e *held, committed bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e.storing = false
	if !committed {
		return
	}
	cs.settled[k[0]].Add(1)
	if cs.byKey[k] == e {
		delete(cs.byKey, k)
	}
}

// lookup returns k's claim and when its lease ends, or ok false.
func (cs *claims) lookup(k store.Key, t time.Time) (blob store.Encoded, expires int64, ok bool, err error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, 0, false, errClosed
	}
	e := cs.byKey[k]
	if e == nil || !e.alive(t.UnixNano()) {
		return nil, 0, false, nil
	}
	return e.blob, e.expires, true, nil
}

// remove deletes k's claim whoever holds it, and reports whether it held
// the key. A completion under way then fails with ErrNotOwner if it has not
// written yet, and is deleted from the file by the caller if it has.
func (cs *claims) remove(k store.Key, t time.Time) (bool, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return false, errClosed
	}
	e := cs.byKey[k]
	if e == nil {
		return false, nil
	}
	delete(cs.byKey, k)
	return e.alive(t.UnixNano()), nil
}

// list returns the claims made by cutoff that hold their key at t, with
// their records for the caller to decode outside the lock.
func (cs *claims) list(t, cutoff time.Time) (map[store.Key]*held, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil, errClosed
	}
	n := t.UnixNano()
	out := make(map[store.Key]*held)
	for k, e := range cs.byKey {
		if e.alive(n) && !e.blob.CreatedAt().After(cutoff) {
			out[k] = &held{blob: e.blob, expires: e.expires}
		}
	}
	return out, nil
}

// sweep drops the claims whose lease has passed: their owners stalled or
// failed to release them. Until then, claiming their key reports a
// takeover.
func (cs *claims) sweep(t time.Time) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	n := t.UnixNano()
	for k, e := range cs.byKey {
		if !e.alive(n) {
			delete(cs.byKey, k)
		}
	}
}

// close makes every later call fail as the closed file does.
func (cs *claims) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
}
