package store

import (
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// backend is a pooled resource that notes when it is closed.
type backend struct {
	once   sync.Once
	closed chan struct{}
}

func (b *backend) Destruct() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

func (b *backend) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// provisioned is a store of one config, as a store module's Provision
// leaves it: registered, with its use of the backend at key in pool.
func provisioned(t *testing.T, pool *caddy.UsagePool, name, key string) (*fake, *backend) {
	t.Helper()
	val, _, err := pool.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &backend{closed: make(chan struct{})}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &fake{}
	register(t, config(t), name, name, s)
	return s, val.(*backend)
}

// shortLinger makes Detach's linger short for one test.
func shortLinger(t *testing.T) {
	linger := detachLinger
	detachLinger = 20 * time.Millisecond
	t.Cleanup(func() { detachLinger = linger })
}

// waitClosed waits for b to be closed, at most a few seconds.
func waitClosed(t *testing.T, b *backend, what string) {
	t.Helper()
	select {
	case <-b.closed:
	case <-time.After(5 * time.Second):
		t.Fatal(what)
	}
}

func wantReferences(t *testing.T, pool *caddy.UsagePool, key string, want int) {
	t.Helper()
	if n, _ := pool.References(key); n != want {
		t.Fatalf("pool entry %s has %d references, want %d", key, n, want)
	}
}

// A reload that changes the store's options: the old config's backend
// stays open across its Cleanup while a request holds the store, and is
// closed, its pool entry gone, with the last hold.
func TestDetachWaitsForHolds(t *testing.T) {
	shortLinger(t)
	pool := caddy.NewUsagePool()
	const name = "fake holds-test"
	old, oldBackend := provisioned(t, pool, name, "old")
	holds := HoldsOf(old)
	if holds == nil {
		t.Fatal("a registered store has no holds")
	}
	holds.Add(time.Minute) // a request
	holds.Add(time.Minute) // and the background retry it started

	_, newBackend := provisioned(t, pool, name, "new") // the new config
	key := "old"
	if err := Detach(old, name, pool, &key); err != nil {
		t.Fatal(err)
	}
	if oldBackend.isClosed() {
		t.Fatal("the backend was closed by the Cleanup while requests hold the store")
	}
	wantReferences(t, pool, "old", 1)
	holds.Done()
	if oldBackend.isClosed() {
		t.Fatal("the backend was closed while a hold is left")
	}
	holds.Done()
	waitClosed(t, oldBackend, "the backend is still open after the last hold was given back")
	if _, ok := pool.References("old"); ok {
		t.Fatal("the old pool entry is still there after the last hold: leaked")
	}
	holds.Add(time.Minute) // a straggler: harmless
	holds.Done()
	if newBackend.isClosed() {
		t.Fatal("the new config's backend was closed")
	}
}

// A store that nothing replaced and no request holds (Caddy stops, a
// test ends) is given back at once.
func TestDetachWithoutHolds(t *testing.T) {
	pool := caddy.NewUsagePool()
	const name = "fake holds-none"
	s, b := provisioned(t, pool, name, "k")
	h := HoldsOf(s)
	h.Add(time.Minute)
	h.Done() // a request that ended before the Cleanup
	key := "k"
	if err := Detach(s, name, pool, &key); err != nil {
		t.Fatal(err)
	}
	if !b.isClosed() {
		t.Fatal("the backend is still open after a Cleanup that nothing replaced and no request holds")
	}
	if key != "" || Detach(s, name, pool, &key) != nil {
		t.Fatal("a second Detach did something")
	}
}

// A store that a reload replaced lingers even without holds: a request
// that the old server read just before it stopped starts after the
// Cleanup, and must find its store open when it takes its hold.
func TestDetachReplacedLingers(t *testing.T) {
	shortLinger(t)
	pool := caddy.NewUsagePool()
	const name = "fake holds-linger"
	s, b := provisioned(t, pool, name, "old")
	h := HoldsOf(s)
	_, newBackend := provisioned(t, pool, name, "new") // the new config
	key := "old"
	start := time.Now()
	if err := Detach(s, name, pool, &key); err != nil {
		t.Fatal(err)
	}
	h.Add(time.Minute) // the old config's straggler, just after the Cleanup
	time.Sleep(2 * detachLinger)
	if b.isClosed() {
		t.Fatal("the backend was closed under a request that took its hold within the linger")
	}
	h.Done()
	waitClosed(t, b, "the backend is still open after the linger and the last hold")
	if took := time.Since(start); took < detachLinger {
		t.Fatalf("closed %v after the Cleanup, before the linger (%v)", took, detachLinger)
	}
	if newBackend.isClosed() {
		t.Fatal("the new config's backend was closed")
	}
}

// A hold that is never given back (a hung request) keeps the backend for
// its lease plus drainMargin, not for ever.
func TestDetachBound(t *testing.T) {
	shortLinger(t)
	margin := drainMargin
	drainMargin = 20 * time.Millisecond
	t.Cleanup(func() { drainMargin = margin })
	pool := caddy.NewUsagePool()
	const name = "fake holds-bound"
	s, b := provisioned(t, pool, name, "k")
	h := HoldsOf(s)
	h.Add(30 * time.Millisecond)
	h.Add(80 * time.Millisecond) // the longest lease counts
	h.Done()
	key := "k"
	start := time.Now()
	if err := Detach(s, name, pool, &key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend of a hung request's store was never closed")
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("closed %v after the Cleanup, before the longest lease plus the margin (100ms)", took)
	}
	if _, ok := pool.References("k"); ok {
		t.Fatal("the pool entry is still there")
	}
	h.Done() // the hung request ends at last: nothing more happens
}

// A reload back to the old options within the drain reuses the old
// backend: the deferred give-back leaves the new config's reference.
func TestDetachThenReloadBack(t *testing.T) {
	shortLinger(t)
	pool := caddy.NewUsagePool()
	const name = "fake holds-back"
	old, b := provisioned(t, pool, name, "k")
	h := HoldsOf(old)
	h.Add(time.Minute)
	key := "k"
	if err := Detach(old, name, pool, &key); err != nil {
		t.Fatal(err)
	}
	_, again := provisioned(t, pool, name, "k")
	if again != b {
		t.Fatal("the config that asks for the old options again got a new backend")
	}
	h.Done()
	time.Sleep(5 * detachLinger) // the linger passes too
	if b.isClosed() {
		t.Fatal("the backend the current config uses was closed")
	}
	wantReferences(t, pool, "k", 1)
}

// Take and Give are safe on a store that does not register.
func TestHoldsNil(t *testing.T) {
	h := HoldsOf(&fake{})
	h.Add(time.Second)
	h.Done()
	if h.later(func() { t.Fatal("ran") }, true) {
		t.Fatal("nil holds deferred a release")
	}
}

// The last hold's Give is a request's: it must not wait for the backend
// to close (a pool's Close waits for its connections, which a stalled
// network can hold for long).
func TestLastGiveDoesNotWaitForTheClose(t *testing.T) {
	h := new(Holds)
	h.Add(time.Second)
	closing := make(chan struct{})
	defer close(closing)
	if !h.later(func() { <-closing }, false) {
		t.Fatal("later kept nothing although a hold was taken")
	}
	gave := make(chan struct{})
	go func() {
		h.Done()
		close(gave)
	}()
	select {
	case <-gave:
	case <-time.After(5 * time.Second):
		t.Fatal("the last Give waited for the backend to close")
	}
}
