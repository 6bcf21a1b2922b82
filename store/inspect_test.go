package store

import (
	"net/http"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	created := time.Unix(1700000000, 0)
	s := Summarize(&Record{State: Completed, Endpoint: "POST h/p", CreatedAt: created,
		Response: Response{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("12345"), Truncated: true}})
	want := Summary{State: Completed, Endpoint: "POST h/p", CreatedAt: created, Status: 201, BodySize: 5, Truncated: true}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
}

func TestSortEntries(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	e := func(b byte, age time.Duration) Entry {
		return Entry{Key: Key{b}, Summary: Summary{CreatedAt: t0.Add(-age)}}
	}
	got := SortEntries([]Entry{e(3, time.Second), e(2, time.Minute), e(1, time.Second), e(4, time.Hour)}, 3)
	if len(got) != 3 || got[0].Key[0] != 4 || got[1].Key[0] != 2 || got[2].Key[0] != 1 {
		t.Fatalf("SortEntries = %v, want keys 4, 2, 1", got)
	}
	if got := SortEntries([]Entry{e(1, 0)}, -1); len(got) != 0 {
		t.Fatalf("SortEntries with a negative limit = %v", got)
	}
}
