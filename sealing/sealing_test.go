package sealing

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// A test key: 32 bytes, in base64.
var sealKeyA = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa1}, 32))

// The key hash and the record's clear fields are associated data: a
// sealed response does not open under another key, nor with another
// status, state, flag, endpoint or fingerprint.
func TestSealBindsKeyAndClearFields(t *testing.T) {
	ring, err := NewKeyring([]string{sealKeyA})
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := store.NewKey("", "one"), store.NewKey("", "two")
	c := &store.Claim{Endpoint: "POST api.example.com/orders", Fingerprint: store.Fingerprint{1}}
	resp := &store.Response{Status: 201, Header: http.Header{"X-A": {"1"}}, Body: []byte("body")}
	sealed, err := ring.seal(k1, c, resp)
	if err != nil {
		t.Fatal(err)
	}
	rec := &store.Record{State: store.Completed, Endpoint: c.Endpoint, Fingerprint: c.Fingerprint, Response: *sealed}
	if !rec.Sealed || len(rec.Header) != 0 || bytes.Contains(rec.Body, []byte("body")) {
		t.Fatalf("sealed response %+v", sealed)
	}
	if got := BodySize(rec); got != 4 {
		t.Fatalf("sealed record's body size %d, want 4, the response's", got)
	}
	opened, err := ring.open(k1, rec)
	if err != nil || string(opened.Body) != "body" || opened.Header.Get("X-A") != "1" || opened.Sealed {
		t.Fatalf("open: %v %v", opened, err)
	}
	if _, err := ring.open(k2, rec); err == nil || err.(*Unreadable).Reason != "authentication" {
		t.Fatalf("opened under another key: %v", err)
	}
	for name, change := range map[string]func(*store.Record){
		"status":          func(r *store.Record) { r.Status = 200 },
		"state":           func(r *store.Record) { r.State = store.InProgress },
		"truncated":       func(r *store.Record) { r.Truncated = true },
		"outcome_unknown": func(r *store.Record) { r.OutcomeUnknown = true },
		"endpoint":        func(r *store.Record) { r.Endpoint = "POST api.example.com/refunds" },
		"fingerprint":     func(r *store.Record) { r.Fingerprint[0] = 2 },
	} {
		other := *rec
		change(&other)
		if _, err := ring.open(k1, &other); err == nil || err.(*Unreadable).Reason != "authentication" {
			t.Errorf("opened with another %s: %v", name, err)
		}
	}
	resized := *rec
	resized.Body = bytes.Clone(rec.Body)
	resized.Body[1+keyIDLen] = 5 // the stated size, in the envelope's head
	if _, err := ring.open(k1, &resized); err == nil {
		t.Fatal("opened with another stated size")
	}
	again, _ := ring.seal(k1, c, resp)
	nonce := 1 + keyIDLen + 1
	if bytes.Equal(again.Body[nonce:nonce+12], sealed.Body[nonce:nonce+12]) {
		t.Fatal("two seals share a nonce")
	}
}
