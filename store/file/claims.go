package file

import (
	"sync"
	"sync/atomic"
	"time"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// claims are the keys in flight, read in memory and kept in the journal
// (see the package doc), so a new key costs one synced write, its
// completion. A change the journal refuses is not made, and fails as the
// file's would.
//
// A completion is committed to the file before its claim is dropped, so a
// claim is never missing from both; but a duplicate that read the file
// before the commit, and claims after the drop, would claim a completed
// key. So a committed completion counts itself in settled as it drops its
// claim, and take refuses to claim if the count of the key's shard changed
// since before the file was read.
type claims struct {
	mu      sync.Mutex
	byKey   map[store.Key]*held
	log     *journal // nil in the tests of the claims alone
	closed  bool     // the file is closed: every call fails as the file's would
	settled [settledShards]atomic.Uint64
}

// settledShards is the number of counts of committed completions, a key's
// shard being its first byte (keys are SHA-256 sums).
const settledShards = 256

// generation returns the count of committed completions of k's shard, for
// take, read before the file.
func (cs *claims) generation(k store.Key) uint64 { return cs.settled[k[0]].Load() }

// held is one claim.
type held struct {
	blob    store.Encoded // never written once built: decoded outside the lock
	expires int64         // the end of the lease, in Unix nanoseconds
	// keep is how long past its lease the claim is kept for a dead owner
	// (dead.go), unless it is taken over: its Claim.TTL.
	keep time.Duration
	// storing is set while the owner's completion is being committed: the
	// claim holds whatever its lease says, and cannot be taken over,
	// released or completed again.
	storing bool
}

// errClosed is bbolt's answer once the file is closed.
var errClosed = berrors.ErrDatabaseNotOpen

// alive reports whether e holds its key at n.
func (e *held) alive(n int64) bool { return e.storing || n < e.expires }

// taken is what take made of a claim.
type taken struct {
	holder   store.Encoded // the live claim that holds the key, if any
	tookOver bool          // the claim replaced a dead owner's
	// stale: a completion of the key's shard was committed since
	// generation returned the caller's count, and the caller must read
	// the file again.
	stale bool
	// heir, with Claim.KeepUnknown, is the claim that replaced a dead
	// owner's, bound as the dead one was, pinned for its completion as
	// the dead request's unknown outcome (database.keepUnknown).
	heir *held
}

// take claims k for c at t unless it is held, returning then the holder's
// record; gen is what generation returned before the caller read the file.
func (cs *claims) take(k store.Key, c *store.Claim, t time.Time, gen uint64) (taken, error) {
	e := &held{blob: store.AppendClaim(nil, c), expires: t.Add(c.Lease).UnixNano(), keep: keepOf(c)}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return taken{}, errClosed
	}
	n := t.UnixNano()
	old := cs.byKey[k]
	if old != nil && old.alive(n) {
		return taken{holder: old.blob}, nil
	}
	if cs.settled[k[0]].Load() != gen {
		return taken{stale: true}, nil
	}
	r := taken{tookOver: old != nil && !old.gone(n)}
	if r.tookOver && c.KeepUnknown {
		if err := e.inherit(old, c); err != nil {
			return taken{}, err
		}
		r.heir = e
	}
	if err := cs.log.put(k, e); err != nil {
		return taken{}, err
	}
	cs.byKey[k] = e
	return r, nil
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

// release removes the claim held by tok, its lease passed or not: until a
// takeover, its owner knows best what became of its request.
func (cs *claims) release(k store.Key, tok store.Token) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return errClosed
	}
	e := cs.byKey[k]
	if e == nil || !e.blob.ClaimedBy(tok) {
		return store.ErrNotOwner
	}
	if e.storing {
		return store.ErrNotOwner // the completion under way takes it
	}
	if err := cs.log.drop(k); err != nil {
		return err
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
	renewed := *e
	renewed.expires = t.Add(lease).UnixNano()
	if err := cs.log.put(k, &renewed); err != nil {
		return err
	}
	e.expires = renewed.expires
	return nil
}

// pin marks the claim held by tok as being completed, until settle.
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

// settle ends the completion of e: a committed one drops the claim and
// counts itself for take; a failed one leaves the claim to its owner, who
// may try again. An operator may have removed e meanwhile. The claim is
// dropped from memory even if the journal refuses the drop (or the process
// dies first): the next process keeps the owner's committed record
// (loadClaims).
func (cs *claims) settle(k store.Key, e *held, committed bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e.storing = false
	if !committed {
		return
	}
	cs.settled[k[0]].Add(1)
	if cs.byKey[k] == e {
		cs.log.drop(k)
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
// written yet; the caller deletes it from the file if it has.
//
// The journal is told even if memory holds no claim: a committed
// completion whose end of claim the journal refused (settle) left its
// claim there, and once the caller has deleted the record, nothing would
// stop the next process from bringing the claim back.
func (cs *claims) remove(k store.Key, t time.Time) (bool, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return false, errClosed
	}
	if err := cs.log.drop(k); err != nil {
		return false, err
	}
	e := cs.byKey[k]
	delete(cs.byKey, k)
	return e != nil && e.alive(t.UnixNano()), nil
}

// list returns copies of the claims made by cutoff that hold their key at t.
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

// sweep drops the dead owners' claims that are kept no longer (held.gone):
// until then, claiming their key takes them over.
func (cs *claims) sweep(t time.Time) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return nil
	}
	n := t.UnixNano()
	var gone []store.Key
	for k, e := range cs.byKey {
		if e.gone(n) {
			gone = append(gone, k)
		}
	}
	if err := cs.log.drop(gone...); err != nil {
		return err
	}
	for _, k := range gone {
		delete(cs.byKey, k)
	}
	return nil
}

// compact rewrites the journal from the claims in memory, if it has grown
// past its limit.
func (cs *claims) compact() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed || cs.log.size <= cs.log.limit {
		return nil
	}
	return cs.log.compact(cs.byKey)
}

// close makes every later call fail as the closed file does.
func (cs *claims) close() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	return cs.log.close()
}
