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
		Status:      201,
		Header:      http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}},
		Body:        []byte{0, 1, 2, 0xff, '\n'},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, rec := range []*Record{
		sampleRecord(),
		{State: InProgress, Endpoint: "PATCH h/p", CreatedAt: time.Unix(0, 1)},
		{State: Completed, Status: 200, Truncated: true, CreatedAt: time.Unix(5, 0)},
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

func TestTokenAtFixedOffset(t *testing.T) {
	rec := sampleRecord()
	b := AppendRecord(nil, rec)
	if !bytes.Equal(b[TokenOffset:TokenOffset+len(rec.Token)], rec.Token[:]) {
		t.Fatal("the owner token is not where server-side scripts look for it")
	}
}

func TestDecodeRefusesCorruptInput(t *testing.T) {
	good := AppendRecord(nil, sampleRecord())
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:fixedLen-1],
		"magic":     append([]byte{'X'}, good[1:]...),
		"state":     append([]byte{magic, 7}, good[2:]...),
		"truncated": good[:fixedLen+3],
	} {
		if _, err := DecodeRecord(b); err != ErrCorrupt {
			t.Errorf("%s: DecodeRecord = %v, want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, sampleRecord()))
	f.Add(AppendClaim(nil, &Claim{Endpoint: "POST h/p"}, time.Unix(1, 0)))
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
			!bytes.Equal(again.Body, rec.Body) || len(again.Header) != len(rec.Header) {
			t.Fatalf("re-encoding changed the record:\n%+v\n%+v", rec, again)
		}
	})
}
