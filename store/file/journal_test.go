package file

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// journalClaims replays the journal of s as the next process would.
func journalClaims(t *testing.T, s *Store) map[store.Key]*held {
	t.Helper()
	b, err := os.ReadFile(s.db().claims.log.path)
	if err != nil {
		t.Fatal(err)
	}
	claims, n := replay(b)
	if n != len(b) {
		t.Fatalf("the journal has %d bytes, of which %d are entries", len(b), n)
	}
	return claims
}

// sameClaims fails unless the journal replays to the claims in memory.
func sameClaims(t *testing.T, s *Store) {
	t.Helper()
	got := journalClaims(t, s)
	cs := s.db().claims
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(got) != len(cs.byKey) {
		t.Fatalf("the journal replays to %d claims, memory holds %d", len(got), len(cs.byKey))
	}
	for k, e := range cs.byKey {
		j := got[k]
		if j == nil || !bytes.Equal(j.blob, e.blob) || j.expires != e.expires {
			t.Fatalf("claim %v: the journal has %+v, memory %+v", k, j, e)
		}
	}
}

// Whatever the store does to its claims, the journal replays to the
// claims in memory: claims, renewals, releases, completions, purges,
// takeovers, sweeps and compactions.
func TestJournalReplaysToTheClaims(t *testing.T) {
	s := storetest.Provision(t, &Store{Path: t.TempDir()})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]store.Key, 16)
	for i := range keys {
		keys[i] = storetest.NewKey()
	}
	owners := map[store.Key]*store.Claim{}
	for i := range 2000 {
		k := keys[rng.IntN(len(keys))]
		c := owners[k]
		switch op := rng.IntN(7); {
		case op == 0 || c == nil:
			c = claim(time.Duration(rng.IntN(3)) * time.Millisecond) // some expire at once
			if got, err := s.Acquire(ctx, k, c); err != nil {
				t.Fatal(err)
			} else if got.Record == nil {
				owners[k] = c
			}
		case op == 1:
			s.Renew(ctx, k, c.Token, time.Minute)
		case op == 2:
			s.Release(ctx, k, c.Token)
		case op == 3:
			s.Complete(ctx, k, c, &store.Response{Status: 201}, time.Millisecond)
		case op == 4:
			if _, err := s.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
		case op == 5:
			if err := s.db().claims.sweep(now()); err != nil {
				t.Fatal(err)
			}
		case op == 6 && i%10 == 0:
			s.db().claims.mu.Lock()
			err := s.db().claims.log.compact(s.db().claims.byKey)
			s.db().claims.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	sameClaims(t, s)
}

// The journal is rewritten from the claims in memory once it has grown
// past its limit: released claims leave no trace, held ones stay.
func TestJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	held, c := storetest.NewKey(), claim(time.Hour)
	if _, err := s.Acquire(ctx, held, c); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		k, c := storetest.NewKey(), claim(time.Minute)
		if _, err := s.Acquire(ctx, k, c); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, k, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	grown := fi.Size()
	// Due at the next append; the sweeper's loop compacts it.
	cs := s.db().claims
	cs.mu.Lock()
	cs.log.limit = 0
	cs.mu.Unlock()
	k, c2 := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c2); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool {
		fi, err := os.Stat(filepath.Join(dir, journalName))
		return err == nil && fi.Size() < grown/10
	}) {
		t.Fatalf("the journal of 2 claims was not compacted from %d bytes", grown)
	}
	sameClaims(t, s)
	if got := journalClaims(t, s); len(got) != 2 || got[held] == nil || got[k] == nil {
		t.Fatalf("the compacted journal holds %d claims, want the 2 held", len(got))
	}
	if _, err := os.Stat(filepath.Join(dir, journalName+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the compaction left its copy: %v", err)
	}
}

func eventually(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A journal whose end a crash of the OS tore is read up to the tear: the
// claims before it hold, the next process writes after them, and a copy
// that a compaction cut short is removed.
func TestJournalTornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, journalName)
	kept, torn := storetest.NewKey(), storetest.NewKey()
	keptClaim := claim(time.Hour)
	expires := time.Now().Add(time.Hour).UnixNano()
	b := appendEntry(nil, kept, &held{blob: store.AppendClaim(nil, keptClaim), expires: expires, keep: time.Hour})
	whole := len(b)
	b = appendEntry(b, torn, &held{blob: store.AppendClaim(nil, claim(time.Hour)), expires: expires, keep: time.Hour})
	b = b[:len(b)-3]
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if claims, n := replay(b); n != whole || len(claims) != 1 {
		t.Fatalf("replay of a torn journal: %d claims from %d bytes; want 1 from %d", len(claims), n, whole)
	}
	// A flipped bit in the last entry ends the replay too.
	flipped := bytes.Clone(b[:whole])
	flipped[whole-1] ^= 1
	if claims, n := replay(flipped); n != 0 || len(claims) != 0 {
		t.Fatalf("replay of a corrupt entry: %d claims from %d bytes; want none", len(claims), n)
	}

	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	if got, err := s.Acquire(ctx, kept, claim(time.Minute)); err != nil || got.Record == nil || got.Record.Token != keptClaim.Token {
		t.Fatalf("the claim before the tear = %+v, %v; want it held", got, err)
	}
	if got, err := s.Acquire(ctx, torn, claim(time.Minute)); err != nil || got.Record != nil || got.TookOver {
		t.Fatalf("the torn claim = %+v, %v; want a new claim", got, err)
	}
	sameClaims(t, s)
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cut-short copy is still there: %v", err)
	}
}

// A change the journal refuses is not made: the claim, renewal, release
// or purge fails as a store error and memory keeps what the journal has.
// A committed completion still drops its claim: its record wins.
func TestJournalRefusesAWrite(t *testing.T) {
	dir := t.TempDir()
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	done, dc := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, done, dc); err != nil {
		t.Fatal(err)
	}

	restore := refuseJournalWrites(t, s)
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("%s with a journal that refuses writes = %v, want ErrUnavailable", what, err)
		}
	}
	_, err := s.Acquire(ctx, storetest.NewKey(), claim(time.Minute))
	unavailable("Acquire", err)
	unavailable("Renew", s.Renew(ctx, k, c.Token, time.Hour))
	unavailable("Release", s.Release(ctx, k, c.Token))
	_, err = s.Delete(ctx, k)
	unavailable("Delete", err)
	if err := s.Complete(ctx, done, dc, &store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatalf("Complete with a journal that refuses writes: %v", err)
	}

	restore()
	if got, err := s.Acquire(ctx, k, claim(time.Minute)); err != nil || got.Record == nil || got.Record.Token != c.Token {
		t.Fatalf("the claim after refused changes = %+v, %v; want it held", got, err)
	}
	if got, err := s.Acquire(ctx, done, claim(time.Minute)); err != nil || got.Record == nil || got.Record.State != store.Completed {
		t.Fatalf("the completed key = %+v, %v; want its record", got, err)
	}
	if rec, exp, err := s.Lookup(ctx, k); err != nil || rec == nil || exp.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Lookup of the claim = %+v until %v, %v; want the lease the journal has", rec, exp, err)
	}
}

// A purge is final (issue 35): a completion whose end of claim the journal
// refused (a full disk) leaves the claim in the journal, and once the key
// is purged no record wins over it there. The next process must not bring
// the claim back.
func TestPurgeAfterARefusedEndOfClaim(t *testing.T) {
	dir := t.TempDir()
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	k, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, k, c); err != nil {
		t.Fatal(err)
	}
	restore := refuseJournalWrites(t, s)
	if err := s.Complete(ctx, k, c, &store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatalf("Complete with a journal that refuses writes: %v", err)
	}
	restore()
	if found, err := s.Delete(ctx, k); err != nil || !found {
		t.Fatalf("Delete = %v, %v; want the record purged", found, err)
	}
	s.Cleanup()

	s = storetest.Provision(t, &Store{Path: dir})
	if got, err := s.Acquire(ctx, k, claim(time.Minute)); err != nil || got.Record != nil || got.TookOver {
		t.Fatalf("Acquire of the purged key after a restart = %+v (TookOver %v), %v; want a new claim", got.Record, got.TookOver, err)
	}
}

// refuseJournalWrites makes every append to s's journal fail, until the
// returned function undoes it.
func refuseJournalWrites(t *testing.T, s *Store) (restore func()) {
	t.Helper()
	cs := s.db().claims
	cs.mu.Lock()
	defer cs.mu.Unlock()
	good := cs.log.f
	readOnly, err := os.Open(cs.log.path)
	if err != nil {
		t.Fatal(err)
	}
	cs.log.f = readOnly
	return func() {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		cs.log.f = good
		readOnly.Close()
	}
}

// A journal of the first format, whose entries kept no TTL, is not misread:
// its first entry ends the replay, even one whose claim, read 8 bytes on
// where this format's claim starts, looks like a claim (its token there).
func TestJournalOfTheFirstFormat(t *testing.T) {
	c := claim(time.Hour)
	copy(c.Token[6:], store.StatePrefix(store.InProgress))
	blob := store.AppendClaim(nil, c)
	k := storetest.NewKey()
	old := binary.BigEndian.AppendUint32(make([]byte, 4), uint32(8+len(blob)))
	old = append(old, k[:]...)
	old = binary.BigEndian.AppendUint64(old, uint64(time.Now().Add(time.Hour).UnixNano()))
	old = append(old, blob...)
	binary.BigEndian.PutUint32(old, crc32.Checksum(old[4:], crc32.MakeTable(crc32.Castagnoli)))
	if claims, n := replay(old); n != 0 || len(claims) != 0 {
		t.Fatalf("replay of an entry of the first format: %d claims from %d bytes; want none", len(claims), n)
	}
}
