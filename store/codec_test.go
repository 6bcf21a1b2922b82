package store

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func sampleRecord() *Record {
	return &Record{
		State:       Completed,
		Token:       Token{1, 2, 3},
		Endpoint:    "POST api.example.com/orders",
		Fingerprint: Fingerprint{9, 9, 9},
		CreatedAt:   time.Unix(1700000000, 123456789),
		Response: Response{
			Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}},
			Body:   []byte{0, 1, 2, 0xff, '\n'},
		},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, rec := range []*Record{
		sampleRecord(),
		{State: InProgress, Endpoint: "PATCH h/p", CreatedAt: time.Unix(0, 1)},
		{State: Completed, Response: Response{Status: 200, Truncated: true}, CreatedAt: time.Unix(5, 0)},
		{State: Completed, Response: Response{OutcomeUnknown: true}, CreatedAt: time.Unix(6, 0)},
		{State: Completed, Response: Response{Status: 200, Truncated: true, OutcomeUnknown: true}, CreatedAt: time.Unix(7, 0)},
		{State: Completed, Response: Response{Status: 201, Body: []byte("x")}, CreatedAt: time.Unix(5, 0), ExpiresAt: time.Unix(86405, 7)},
		{State: Completed, Response: Response{Status: 201, Body: []byte("sealed"), Sealed: true}, ExpiresAt: time.Unix(86405, 7)},
	} {
		got, err := DecodeRecord(AppendRecord(nil, rec))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, rec) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, rec)
		}
	}
}

// The flags byte is part of the stored format, which the Redis store's
// scripts read too (FlagWatched): each flag keeps its bit.
func TestFlagBits(t *testing.T) {
	for _, tc := range []struct {
		rec   Record
		flags byte
	}{
		{Record{State: Completed, Response: Response{Status: 200}}, 0},
		{Record{State: Completed, Response: Response{Status: 200, Truncated: true}}, 1},
		{Record{State: Completed, Response: Response{OutcomeUnknown: true}}, 2},
		{Record{State: Completed, Response: Response{Truncated: true, OutcomeUnknown: true}}, 3},
		{Record{State: Completed, Response: Response{Status: 200, Sealed: true}}, 4},
	} {
		if got := AppendRecord(nil, &tc.rec)[flagsOff]; got != tc.flags {
			t.Errorf("%+v: flags %08b, want %08b", tc.rec, got, tc.flags)
		}
	}
}

// The stores check ownership and list claims from the head alone: what it
// tells must agree with the decoded record.
func TestOwnerPrefixAndHead(t *testing.T) {
	tok, other := Token{1, 2, 3}, Token{1, 2, 4}
	claim := AppendClaim(nil, &Claim{Token: tok, Endpoint: "POST h/p", CreatedAt: time.Unix(7, 8)})
	completed := AppendRecord(nil, &Record{State: Completed, Token: tok, CreatedAt: time.Unix(9, 10)})
	owner := AppendOwner(nil, tok)
	if len(owner) != OwnerLen || !bytes.HasPrefix(claim, owner) || bytes.HasPrefix(completed, owner) {
		t.Fatalf("owner prefix %x (%d bytes): must start the claim %x alone", owner, OwnerLen, claim)
	}
	for _, tc := range []struct {
		name      string
		b         []byte
		state     State
		created   time.Time
		claimedBy Token
	}{
		{"claim", claim, InProgress, time.Unix(7, 8), tok},
		{"completed", completed, Completed, time.Unix(9, 10), Token{}},
		{"empty", nil, 0, time.Time{}, Token{}},
		{"owner prefix alone", owner, 0, time.Time{}, Token{}},
		{"wrong magic", append([]byte{'X'}, claim[1:]...), 0, time.Time{}, Token{}},
	} {
		e := Encoded(tc.b)
		if got := e.State(); got != tc.state {
			t.Errorf("%s: State = %v, want %v", tc.name, got, tc.state)
		}
		if got := e.CreatedAt(); !got.Equal(tc.created) {
			t.Errorf("%s: CreatedAt = %v, want %v", tc.name, got, tc.created)
		}
		if e.ClaimedBy(tok) != (tc.claimedBy == tok) || e.ClaimedBy(other) {
			t.Errorf("%s: ClaimedBy(%x) = %t, ClaimedBy(%x) = %t", tc.name, tok[:3], e.ClaimedBy(tok), other[:3], e.ClaimedBy(other))
		}
	}
}

// The expiry is read from the head, where the local tiers look for it: a
// claim has none.
func TestExpiresAt(t *testing.T) {
	at := time.Unix(1700086400, 5)
	rec := sampleRecord()
	rec.ExpiresAt = at
	if got := Encoded(AppendRecord(nil, rec)).ExpiresAt(); !got.Equal(at) {
		t.Errorf("ExpiresAt = %v, want %v", got, at)
	}
	claim := AppendClaim(nil, &Claim{CreatedAt: time.Unix(1, 0)})
	if got := Encoded(claim).ExpiresAt(); !got.IsZero() {
		t.Errorf("ExpiresAt of a claim = %v", got)
	}
	// The flag bits leave it alone.
	rec.Truncated, rec.Sealed = true, true
	if got := Encoded(AppendRecord(nil, rec)).ExpiresAt(); !got.Equal(at) {
		t.Errorf("ExpiresAt of a truncated record = %v, want %v", got, at)
	}
}

func TestDecodeRefusesCorruptInput(t *testing.T) {
	good := AppendRecord(nil, sampleRecord())
	long := append([]byte(nil), good...)
	long[fixedLen] = 0x7f // a text longer than the record
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:fixedLen-1],
		"magic":     append([]byte{'X'}, good[1:]...),
		"state":     append([]byte{magic, 7}, good[2:]...),
		"truncated": good[:fixedLen+3],
		"text":      long,
		"no text":   good[:fixedLen],
	} {
		if _, err := DecodeRecord(b); err != ErrCorrupt {
			t.Errorf("%s: DecodeRecord = %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, sampleRecord()))
	f.Add(AppendClaim(nil, &Claim{Endpoint: "POST h/p", CreatedAt: time.Unix(1, 0)}))
	f.Add([]byte{magic, byte(Completed)})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := DecodeRecord(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to something that decodes the same.
		again, err := DecodeRecord(AppendRecord(nil, rec))
		if err != nil {
			t.Fatalf("re-encoding of a decoded record does not decode: %v", err)
		}
		if again.State != rec.State || again.Endpoint != rec.Endpoint || again.Status != rec.Status ||
			again.Truncated != rec.Truncated || again.OutcomeUnknown != rec.OutcomeUnknown || again.Sealed != rec.Sealed ||
			!bytes.Equal(again.Body, rec.Body) || len(again.Header) != len(rec.Header) {
			t.Fatalf("re-encoding changed the record:\n%+v\n%+v", rec, again)
		}
	})
}

// Records kept as their encoding (the memory store) are allocated at their
// exact size: AppendRecord sizes what it grows.
func TestAppendClaimAndCompletedAreExact(t *testing.T) {
	long := string(make([]byte, 300)) // a two-byte length prefix
	c := &Claim{Token: Token{1}, Endpoint: long, Fingerprint: Fingerprint{2}, CreatedAt: time.Unix(3, 0)}
	expires := time.Unix(4, 0)
	resp := &Response{Status: 201, Body: []byte("{}"), Truncated: true, OutcomeUnknown: true, Header: http.Header{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"a=1", long, ""},
		"X-Empty":      {},
	}}
	claim := AppendClaim(nil, c)
	want := AppendRecord(nil, &Record{State: InProgress, Token: c.Token, Endpoint: c.Endpoint,
		Fingerprint: c.Fingerprint, CreatedAt: c.CreatedAt})
	if !bytes.Equal(claim, want) || cap(claim) != len(claim) {
		t.Errorf("AppendClaim: %d bytes (cap %d), want the %d of AppendRecord exactly", len(claim), cap(claim), len(want))
	}
	done := AppendCompleted([]byte("prefix"), c, resp, expires)
	want = AppendRecord([]byte("prefix"), &Record{State: Completed, Token: c.Token, Endpoint: c.Endpoint,
		Fingerprint: c.Fingerprint, CreatedAt: c.CreatedAt, Response: *resp, ExpiresAt: expires})
	if cap(done) != len(done) || len(done) != len(want) {
		t.Errorf("AppendCompleted: %d bytes (cap %d), want %d exactly", len(done), cap(done), len(want))
	}
	got, err := DecodeRecord(done[len("prefix"):])
	if err != nil || got.State != Completed || got.Token != c.Token || got.Endpoint != long || got.Fingerprint != c.Fingerprint ||
		!got.CreatedAt.Equal(c.CreatedAt) || got.Status != 201 || !got.Truncated || !got.OutcomeUnknown || string(got.Body) != "{}" || !got.ExpiresAt.Equal(expires) ||
		len(got.Header) != 3 || got.Header["Set-Cookie"][1] != long || len(got.Header["X-Empty"]) != 0 {
		t.Fatalf("AppendCompleted decodes to %+v, %v", got, err)
	}
}

// The watched flag is set in place on a stored claim by a store's script;
// the claim must read the same with it, and its owner prefix be unchanged.
func TestWatchedFlagIsIgnoredByDecoding(t *testing.T) {
	c := &Claim{Token: Token{7}, Endpoint: "POST h/p", Fingerprint: Fingerprint{8}, CreatedAt: time.Unix(9, 0)}
	plain := AppendClaim(nil, c)
	watched := append([]byte(nil), plain...)
	watched[FlagsOffset] |= FlagWatched
	a, errA := DecodeRecord(plain)
	b, errB := DecodeRecord(watched)
	if errA != nil || errB != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("a watched claim decodes to %+v, %v; unwatched %+v, %v", b, errB, a, errA)
	}
	if !Encoded(watched).ClaimedBy(c.Token) || !Encoded(watched).ExpiresAt().IsZero() {
		t.Fatal("the watched flag changed what the head tells")
	}
}

// Headers hold any bytes, and decode with their strings sharing one copy:
// DecodeHeader is what the PostgreSQL store reads its headers column with.
func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{"Content-Type": {"application/json"}},
		{"X-Bytes": {"\x00\xff\n\"\\", ""}, "X-None": {}, "": {"empty name"}},
	} {
		got, err := DecodeHeader(AppendHeader(nil, h))
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 0 {
			if got != nil {
				t.Errorf("empty header decodes to %v", got)
			}
			continue
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("round trip: got %q, want %q", got, h)
		}
	}
	b := AppendHeader(nil, http.Header{"A": {"b"}})
	for name, bad := range map[string][]byte{"short": b[:len(b)-1], "long": append(b, 0), "empty": nil} {
		if _, err := DecodeHeader(bad); err == nil {
			t.Errorf("%s: DecodeHeader accepted %x", name, bad)
		}
	}
}

func BenchmarkDecodeRecord(b *testing.B) {
	enc := AppendRecord(nil, sampleRecord())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRecord(enc); err != nil {
			b.Fatal(err)
		}
	}
}
