// Package storetest is the contract every idempotency store passes. A
// backend's tests call Run with a function that opens a fresh, empty store.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Opener returns a new, empty store; the test cleans it up via t.Cleanup.
type Opener func(t *testing.T) store.Store

// Run runs the whole contract against the stores that open returns.
func Run(t *testing.T, open Opener) {
	t.Run("ClaimThenConflict", func(t *testing.T) { testClaimThenConflict(t, open(t)) })
	t.Run("ClaimRace", func(t *testing.T) { testClaimRace(t, open(t)) })
	t.Run("CompleteThenReplay", func(t *testing.T) { testCompleteThenReplay(t, open(t)) })
	t.Run("OwnerToken", func(t *testing.T) { testOwnerToken(t, open(t)) })
	t.Run("Release", func(t *testing.T) { testRelease(t, open(t)) })
	t.Run("LeaseExpiryAndTakeover", func(t *testing.T) { testLeaseExpiry(t, open(t)) })
	t.Run("Renew", func(t *testing.T) { testRenew(t, open(t)) })
	t.Run("TTLExpiry", func(t *testing.T) { testTTLExpiry(t, open(t)) })
	t.Run("LargeBinaryBody", func(t *testing.T) { testLargeBinaryBody(t, open(t)) })
	t.Run("Truncated", func(t *testing.T) { testTruncated(t, open(t)) })
	t.Run("OutcomeUnknown", func(t *testing.T) { testOutcomeUnknown(t, open(t)) })
	t.Run("Sealed", func(t *testing.T) { testSealed(t, open(t)) })
	t.Run("KeysAreIndependent", func(t *testing.T) { testIndependentKeys(t, open(t)) })
}

// NewToken returns a random owner token.
func NewToken() store.Token {
	var tok store.Token
	rand.Read(tok[:])
	return tok
}

// NewKey returns a random store key, so runs never see each other's data.
func NewKey() store.Key {
	var k store.Key
	rand.Read(k[:])
	return k
}

func newClaim(lease time.Duration) *store.Claim {
	c := &store.Claim{Token: NewToken(), Endpoint: "POST example.com/orders", CreatedAt: time.Now(), Lease: lease}
	rand.Read(c.Fingerprint[:])
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAcquire(t *testing.T, s store.Store, k store.Key, c *store.Claim) *store.Record {
	t.Helper()
	got, err := s.Acquire(ctx(t), k, c)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return got.Record
}

func completed(status int, body []byte) *store.Response {
	return &store.Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:   body,
	}
}

func testClaimThenConflict(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	if rec := mustAcquire(t, s, k, c); rec != nil {
		t.Fatalf("first Acquire returned a record %+v, want a claim", rec)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil {
		t.Fatal("second Acquire claimed a held key")
	}
	if rec.State != store.InProgress || rec.Token != c.Token || rec.Endpoint != c.Endpoint || rec.Fingerprint != c.Fingerprint {
		t.Fatalf("in-progress record = %+v, want the first claim", rec)
	}
	if age := time.Since(rec.CreatedAt); age < -time.Second || age > time.Minute {
		t.Fatalf("CreatedAt = %v, not about now", rec.CreatedAt)
	}
}

func testClaimRace(t *testing.T, s store.Store) {
	const n = 64
	k := NewKey()
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners, losers := 0, 0
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got, err := s.Acquire(context.Background(), k, newClaim(time.Minute))
			rec := got.Record
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("Acquire: %v", err)
			case rec == nil:
				winners++
			default:
				losers++
			}
		}()
	}
	close(start)
	wg.Wait()
	if winners != 1 || losers != n-1 {
		t.Fatalf("%d goroutines won the claim and %d lost, want 1 and %d", winners, losers, n-1)
	}
}

func testCompleteThenReplay(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	want := completed(201, []byte(`{"id":1}`))
	if err := s.Complete(ctx(t), k, c, want, time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	got := mustAcquire(t, s, k, newClaim(time.Minute))
	if got == nil || got.State != store.Completed {
		t.Fatalf("Acquire after Complete = %+v, want the completed record", got)
	}
	if got.Status != 201 || !bytes.Equal(got.Body, want.Body) || got.Truncated {
		t.Fatalf("replayed status %d body %q truncated %v", got.Status, got.Body, got.Truncated)
	}
	if got.Endpoint != c.Endpoint || got.Fingerprint != c.Fingerprint || got.Token != c.Token || got.Sealed {
		t.Fatalf("completed record lost its binding: endpoint %q", got.Endpoint)
	}
	if d := got.CreatedAt.Sub(c.CreatedAt); d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("CreatedAt = %v, want the claim's %v", got.CreatedAt, c.CreatedAt)
	}
	// Every store tells when a completed record expires: the handler's
	// expiry_header gives it to the client.
	if left := time.Until(got.ExpiresAt); left < 50*time.Second || left > time.Minute+time.Second {
		t.Fatalf("ExpiresAt = %v, %v from now; want the ttl of a minute", got.ExpiresAt, left)
	}
	if len(got.Header) != 2 || got.Header.Get("Content-Type") != "application/json" ||
		len(got.Header["X-Multi"]) != 2 || got.Header["X-Multi"][1] != "b" {
		t.Fatalf("headers did not round trip: %v", got.Header)
	}
	// A completed record cannot be completed or released again by anyone.
	// Its owner repeating Complete (a retry after a lost reply) may be told
	// success, since its work is stored, but must change nothing.
	if err := s.Complete(ctx(t), k, c, completed(500, []byte("overwritten")), time.Minute); err != nil && !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("second Complete = %v, want nil or ErrNotOwner", err)
	}
	if err := s.Complete(ctx(t), k, &store.Claim{Token: NewToken()}, completed(500, []byte("overwritten")), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by a stranger after completion = %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx(t), k, c.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Release after Complete = %v, want ErrNotOwner", err)
	}
	if again := mustAcquire(t, s, k, newClaim(time.Minute)); again == nil || again.State != store.Completed ||
		again.Status != 201 || !bytes.Equal(again.Body, want.Body) {
		t.Fatalf("record changed after refused calls: %+v", again)
	}
}

func testOwnerToken(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	stranger := NewToken()
	if err := s.Complete(ctx(t), k, &store.Claim{Token: stranger}, completed(200, nil), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by a stranger = %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx(t), k, stranger); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Release by a stranger = %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx(t), k, stranger, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Renew by a stranger = %v, want ErrNotOwner", err)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil || rec.State != store.InProgress || rec.Token != c.Token {
		t.Fatalf("claim changed after a stranger's calls: %+v", rec)
	}
	// Calls on a key that was never claimed are refused the same way.
	if err := s.Complete(ctx(t), NewKey(), c, completed(200, nil), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete of an unclaimed key = %v, want ErrNotOwner", err)
	}
}

func testRelease(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Release(ctx(t), k, c.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next := newClaim(time.Minute)
	if rec := mustAcquire(t, s, k, next); rec != nil {
		t.Fatalf("Acquire after Release = %+v, want a new claim", rec)
	}
	// The released owner cannot touch the new claim.
	if err := s.Release(ctx(t), k, c.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Release = %v, want ErrNotOwner", err)
	}
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec == nil || rec.Token != next.Token {
		t.Fatalf("new claim lost after stale Release: %+v", rec)
	}
}

const shortLease = 300 * time.Millisecond

func testLeaseExpiry(t *testing.T, s store.Store) {
	k, stale := NewKey(), newClaim(shortLease)
	mustAcquire(t, s, k, stale)
	time.Sleep(shortLease + 200*time.Millisecond)
	fresh := newClaim(time.Minute)
	if rec := mustAcquire(t, s, k, fresh); rec != nil {
		t.Fatalf("Acquire after the lease passed = %+v, want a takeover", rec)
	}
	// The stale owner wakes up: it must not overwrite or delete the new claim.
	if err := s.Complete(ctx(t), k, stale, completed(200, []byte("stale")), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Complete = %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx(t), k, stale.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Release = %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx(t), k, stale.Token, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Renew = %v, want ErrNotOwner", err)
	}
	if err := s.Complete(ctx(t), k, fresh, completed(200, []byte("fresh")), time.Minute); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec == nil || string(rec.Body) != "fresh" {
		t.Fatalf("record after takeover = %+v", rec)
	}
}

func testRenew(t *testing.T, s store.Store) {
	// A lease four renewal periods long: a loaded machine may pause the
	// test for a while between renewals without losing the claim.
	const lease, every = time.Second, 250 * time.Millisecond
	k, c := NewKey(), newClaim(lease)
	mustAcquire(t, s, k, c)
	// Renew past the original lease: the claim must hold.
	for range 6 {
		time.Sleep(every)
		if err := s.Renew(ctx(t), k, c.Token, lease); err != nil {
			t.Fatalf("Renew: %v", err)
		}
	}
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec == nil || rec.Token != c.Token {
		t.Fatalf("renewed claim was taken over: %+v", rec)
	}
	// Once renewals stop, the lease passes as usual.
	time.Sleep(lease + 300*time.Millisecond)
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec != nil {
		t.Fatalf("claim held after renewals stopped: %+v", rec)
	}
}

func testTTLExpiry(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, completed(200, []byte("x")), shortLease); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec == nil || rec.State != store.Completed {
		t.Fatalf("record gone before its TTL: %+v", rec)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec != nil {
		t.Fatalf("record replayed after its TTL: %+v", rec)
	}
}

func testLargeBinaryBody(t *testing.T, s store.Store) {
	body := make([]byte, 1<<20)
	rand.Read(body)
	body[0], body[1] = 0, 0xff
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, completed(200, body), time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil || !bytes.Equal(rec.Body, body) {
		t.Fatal("1 MiB binary body did not round trip byte for byte")
	}
}

func testTruncated(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, &store.Response{Status: 200, Truncated: true}, time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil || !rec.Truncated || rec.OutcomeUnknown || rec.Status != 200 || len(rec.Body) != 0 {
		t.Fatalf("truncated record = %+v", rec)
	}
}

// A request whose outcome is unknown holds its key, like a response, until
// its TTL: the record says so, and nothing else.
func testOutcomeUnknown(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	if err := s.Complete(ctx(t), k, c, &store.Response{OutcomeUnknown: true}, shortLease); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil || rec.State != store.Completed || !rec.OutcomeUnknown || rec.Truncated ||
		rec.Status != 0 || len(rec.Header) != 0 || len(rec.Body) != 0 {
		t.Fatalf("record of an unknown outcome = %+v", rec)
	}
	if rec.Endpoint != c.Endpoint || rec.Fingerprint != c.Fingerprint {
		t.Fatalf("record of an unknown outcome lost its binding: %+v", rec)
	}
	if err := s.Release(ctx(t), k, c.Token); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Release after an unknown outcome = %v, want ErrNotOwner", err)
	}
	time.Sleep(shortLease + 200*time.Millisecond)
	if rec := mustAcquire(t, s, k, newClaim(time.Minute)); rec != nil {
		t.Fatalf("unknown outcome held its key after its TTL: %+v", rec)
	}
}

// A sealed response is kept as it is given: its body, which holds the
// sealed headers, and the flag that says so.
func testSealed(t *testing.T, s store.Store) {
	k, c := NewKey(), newClaim(time.Minute)
	mustAcquire(t, s, k, c)
	sealed := []byte{0, 1, 2, 0xff}
	if err := s.Complete(ctx(t), k, c, &store.Response{Status: 201, Body: sealed, Sealed: true}, time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	rec := mustAcquire(t, s, k, newClaim(time.Minute))
	if rec == nil || !rec.Sealed || rec.Status != 201 || !bytes.Equal(rec.Body, sealed) || len(rec.Header) != 0 || rec.Truncated || rec.OutcomeUnknown {
		t.Fatalf("sealed record = %+v", rec)
	}
}

func testIndependentKeys(t *testing.T, s store.Store) {
	a, b := NewKey(), NewKey()
	ca := newClaim(time.Minute)
	mustAcquire(t, s, a, ca)
	if rec := mustAcquire(t, s, b, newClaim(time.Minute)); rec != nil {
		t.Fatalf("claim of one key blocked another: %+v", rec)
	}
	if err := s.Complete(ctx(t), a, ca, completed(200, []byte("a")), time.Minute); err != nil {
		t.Fatal(err)
	}
	if rec := mustAcquire(t, s, b, newClaim(time.Minute)); rec == nil || rec.State != store.InProgress {
		t.Fatalf("completing one key changed another: %+v", rec)
	}
}

// CheckUnavailable asserts that every method of s, whose backend the caller
// has just made unreachable (server killed, store closed), fails promptly
// with an error wrapping store.ErrUnavailable and never with a false answer.
func CheckUnavailable(t *testing.T, s store.Store) {
	t.Helper()
	k, c := NewKey(), newClaim(time.Minute)
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s on an unavailable store = %v, want ErrUnavailable", op, err)
		}
	}
	got, err := s.Acquire(ctx(t), k, c)
	if rec := got.Record; rec != nil {
		t.Errorf("Acquire on an unavailable store returned a record: %+v", rec)
	}
	check("Acquire", err)
	check("Complete", s.Complete(ctx(t), k, c, completed(200, nil), time.Minute))
	check("Release", s.Release(ctx(t), k, c.Token))
	check("Renew", s.Renew(ctx(t), k, c.Token, time.Minute))
}
