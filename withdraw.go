package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// A claim whose Acquire or Release failed may be in the store all the same:
// the command reached it and only its reply was lost, or it lands late from
// a backlog. Its request never ran (503) or ran and asked for a retry (a
// release), so the claim must never be taken for a dead owner's: with
// keep, that would answer every retry 502 until ttl. So it is withdrawn
// until the store takes the withdrawal, for as long as the claim can be in
// the store (its lease, then the dead claim's trace of ttl), and a request
// of the same key through this process lands the withdrawal before it
// claims the key. A retry through another instance in the moment between
// the store's return and the withdrawal's can still find the claim.
//
// Commands on other connections are not ordered with a delayed one, so a
// release that finds nothing is repeated until the store has answered
// twice (the second answer comes after the backlog that held the claim).
// PostgreSQL, whose sessions run side by side, answers a release that
// finds nothing with an error while the session of a connection it lost
// is still on the server (store/postgres/lost.go).
// The token is unique to its request, so a release only ever removes that
// request's claim.

// withdrawal is one claim to withdraw.
type withdrawal struct {
	store  store.Store
	holds  *store.Holds // tells when the store was closed
	logger *zap.Logger
	key    store.Key
	token  store.Token
	until  time.Time // when the claim is gone from the store anyway

	// under withdrawals.mu
	answered int           // answers that found no claim of token
	due      time.Time     // the next try in the background
	pause    time.Duration // backoff
	trying   bool          // a try is in flight
}

// withdrawals are the process's claims to withdraw, across handlers and
// config generations: a retry may come through a handler that a reload made.
var withdrawals = pendingWithdrawals{byKey: make(map[store.Key][]*withdrawal)}

type pendingWithdrawals struct {
	n       atomic.Int64 // how many; read by every claim without the lock
	mu      sync.Mutex
	byKey   map[store.Key][]*withdrawal
	running bool // the background loop is alive
}

const (
	// maxWithdrawals bounds the claims held for withdrawal: past it, an
	// outage's claims expire by their lease, as they would with keep off.
	maxWithdrawals      = 100_000
	firstWithdrawPause  = 100 * time.Millisecond
	maxWithdrawPause    = 2 * time.Second
	withdrawCallTimeout = 10 * time.Second
	landWait            = 2 * time.Second
)

// withdraw withdraws the attempt's claim until the store takes it.
func (a *attempt) withdraw() {
	h := a.h
	withdrawals.add(&withdrawal{store: h.store, holds: h.holds, logger: h.logger, key: a.key, token: a.claim.Token,
		until: a.claim.CreatedAt.Add(h.lease + h.ttl), pause: firstWithdrawPause}, h.metrics)
}

// add holds w until it is settled, and tries it again in the background.
func (p *pendingWithdrawals) add(w *withdrawal, m *metrics) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n.Load() >= maxWithdrawals {
		w.logger.Warn("too many claims wait to be withdrawn: this one expires by its lease instead",
			zap.String("key_hash", w.key.String()), zap.Int("withdrawals", maxWithdrawals))
		m.retrySkipped()
		return
	}
	w.holds.Add(0)     // the store stays open while the claim's requests may use it
	w.due = time.Now() // first tried at the loop's next tick
	p.byKey[w.key] = append(p.byKey[w.key], w)
	p.n.Add(1)
	if !p.running {
		p.running = true
		go p.loop()
	}
}

// land tries, before a request of key claims it, the withdrawals of key's
// earlier claims, so that the request never finds one of them, and reports
// whether all have landed. It tries for at most landWait: a store that
// takes no withdrawal meanwhile is failing, and the request is not to
// claim the key until it does (errWithdrawalPending), or the claim could
// land after the store came back, and find the earlier one, its lease
// passed, as a dead owner's.
func (p *pendingWithdrawals) land(ctx context.Context, key store.Key) bool {
	if p.n.Load() == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, landWait)
	defer cancel()
	for {
		p.mu.Lock()
		ws := append([]*withdrawal(nil), p.byKey[key]...)
		p.mu.Unlock()
		switch {
		case len(ws) == 0:
			return true
		case ctx.Err() != nil:
			return false
		}
		for _, w := range ws {
			p.tryHeld(ctx, w)
		}
		select {
		case <-ctx.Done():
		case <-time.After(firstWithdrawPause):
		}
	}
}

// errWithdrawalPending is acquire's answer when an earlier claim of the
// key, which the store failed, is not withdrawn yet.
var errWithdrawalPending = store.Unavailable("acquiring", errors.New("an earlier claim of the key, which the store failed, is not withdrawn yet"))

// loop tries the withdrawals that are due, until none is left.
func (p *pendingWithdrawals) loop() {
	tick := time.NewTicker(firstWithdrawPause)
	defer tick.Stop()
	for now := range tick.C {
		p.mu.Lock()
		if p.n.Load() == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		for _, ws := range p.byKey {
			for _, w := range ws {
				if !w.trying && now.After(w.due) {
					go p.tryHeld(context.Background(), w)
				}
			}
		}
		p.mu.Unlock()
	}
}

// tryHeld tries w, one try at a time, and lets it go once settled.
func (p *pendingWithdrawals) tryHeld(ctx context.Context, w *withdrawal) {
	p.mu.Lock()
	if w.trying || !p.holding(w) {
		p.mu.Unlock()
		return
	}
	w.trying = true
	p.mu.Unlock()

	settled := w.try(ctx)

	p.mu.Lock()
	defer p.mu.Unlock()
	w.trying = false
	w.pause = min(2*w.pause, maxWithdrawPause)
	w.due = time.Now().Add(w.pause)
	if settled && p.holding(w) {
		ws := p.byKey[w.key]
		for i := range ws {
			if ws[i] == w {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(p.byKey, w.key)
		} else {
			p.byKey[w.key] = ws
		}
		p.n.Add(-1)
		w.holds.Done()
	}
}

// holding reports whether w is still held; p.mu is held.
func (p *pendingWithdrawals) holding(w *withdrawal) bool {
	for _, held := range p.byKey[w.key] {
		if held == w {
			return true
		}
	}
	return false
}

// try releases w's claim once, and reports whether that settles it: the
// claim was released, or not found twice, or can no longer be in the
// store.
func (w *withdrawal) try(ctx context.Context) bool {
	if w.holds.Closed() || !time.Now().Before(w.until) {
		return true // a reload closed the store, or the claim is gone
	}
	ctx, cancel := context.WithTimeout(ctx, withdrawCallTimeout)
	defer cancel()
	err := w.store.Release(ctx, w.key, w.token)
	switch {
	case err == nil:
		return true
	case errors.Is(err, store.ErrNotOwner):
		withdrawals.mu.Lock()
		w.answered++
		done := w.answered == 2
		withdrawals.mu.Unlock()
		return done
	}
	return false
}

// A request's claim waits, within this process, for an earlier claim of
// the same key that has been under way here for longer than a store call
// takes (slowClaim): the store may be failing it, and it may land all the
// same, so it is to be set to be withdrawn before another claim of its key
// leaves here. The wait lasts at most inFlightWait; past it the request is
// answered as a duplicate in flight (409, or waits), so that a burst of
// retries never queues behind a failing store. A claim under way for less
// than slowClaim is not waited for: a key's concurrent retries, answered
// by a healthy store, run side by side.

// errClaimInFlight is acquire's answer when an earlier claim of the key is
// under way here for longer than inFlightWait.
var errClaimInFlight = errors.New("another claim of the key is under way in this process")

const (
	slowClaim    = 50 * time.Millisecond
	inFlightWait = time.Second
)

var claimsInFlight = inFlight{byKey: make(map[store.Key]inFlightClaim)}

type inFlight struct {
	mu    sync.Mutex
	byKey map[store.Key]inFlightClaim
}

// inFlightClaim is the first claim of a key under way here; claims sent
// beside it while it is young are not noted.
type inFlightClaim struct {
	started time.Time
	done    chan struct{} // made by the first to wait; closed by end
}

// begin notes a claim of key as under way, once an earlier one under way
// for longer than slowClaim, if any, is answered: first reports whether it
// is noted (then end must be called), ok false if no answer came within
// inFlightWait.
func (f *inFlight) begin(key store.Key) (first, ok bool) {
	deadline := time.Now().Add(inFlightWait)
	for {
		f.mu.Lock()
		c, busy := f.byKey[key]
		switch {
		case !busy:
			f.byKey[key] = inFlightClaim{started: time.Now()}
			f.mu.Unlock()
			return true, true
		case time.Since(c.started) < slowClaim:
			f.mu.Unlock()
			return false, true
		case c.done == nil:
			c.done = make(chan struct{})
			f.byKey[key] = c
		}
		f.mu.Unlock()
		select {
		case <-c.done:
		case <-time.After(time.Until(deadline)):
			return false, false
		}
	}
}

// end notes that key's first claim under way here was answered.
func (f *inFlight) end(key store.Key) {
	f.mu.Lock()
	c := f.byKey[key]
	delete(f.byKey, key)
	f.mu.Unlock()
	if c.done != nil {
		close(c.done)
	}
}
