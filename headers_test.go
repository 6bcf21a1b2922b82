package idempotency

import (
	"net/http"
	"reflect"
	"testing"
)

func TestExchangeHeader(t *testing.T) {
	outer := http.Header{
		"X-Request-Id":                {"outer-id"},
		"Access-Control-Allow-Origin": {"https://a.example"},
		"Cache-Control":               {"no-store"},
	}
	h := outer.Clone()
	h.Add("X-Request-Id", "upstream-id")  // appended by reverse_proxy
	h.Set("Cache-Control", "max-age=60")  // replaced
	h.Set("Location", "/orders/7")        // new
	h.Set("Set-Cookie", "session=caller") // never stored
	got := exchangeHeader(h, outer)
	want := http.Header{
		"X-Request-Id":  {"upstream-id"},
		"Cache-Control": {"max-age=60"},
		"Location":      {"/orders/7"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	if got := exchangeHeader(outer.Clone(), outer); got != nil {
		t.Fatalf("nothing changed, stored %v", got)
	}

	replay := http.Header{"X-Request-Id": {"retry-id"}, "Access-Control-Allow-Origin": {"https://b.example"}}
	replayHeader(replay, want, false)
	if ids := replay.Values("X-Request-Id"); !reflect.DeepEqual(ids, []string{"retry-id", "upstream-id"}) {
		t.Errorf("replayed X-Request-Id %q, want the retry's own, then the upstream's", ids)
	}
	if got := replay.Get("Access-Control-Allow-Origin"); got != "https://b.example" {
		t.Errorf("replayed Access-Control-Allow-Origin %q", got)
	}
}
