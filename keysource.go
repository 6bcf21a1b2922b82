package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddy-idempotency/caddy-idempotency/internal/canonjson"
)

// KeyFrom says where a request's key is read, when not from a header
// (key_header): from a query parameter, which stays in the query the
// upstream sees, or from a string member of a JSON body, named by an RFC
// 6901 pointer, as Square's API sends idempotency_key and a webhook
// receiver dedupes on an event's id. Exactly one is set.
type KeyFrom struct {
	// Query is the name of the query parameter that carries the key.
	Query string `json:"query,omitempty"`
	// JSON is the RFC 6901 pointer to the string member of the JSON body
	// that carries the key. A body that is not JSON, or lacks the member,
	// is a request without a key; a body over max_request_body gets 413.
	JSON string `json:"json,omitempty"`
}

// keySource reads the key's values where the options say: the header's
// values, the query parameter's, or the JSON member's (none or one).
type keySource struct {
	header  string   // canonical header name; "" when the key is elsewhere
	query   string   // query parameter
	pointer []string // JSON pointer's tokens, unescaped; nil when not from the body
	where   string   // for the problems: "the Idempotency-Key request header"
	what    string   // "The Idempotency-Key header"
}

func newKeySource(header string, from *KeyFrom) (keySource, error) {
	switch {
	case from != nil && from.Query != "":
		return keySource{query: from.Query,
			where: "the " + from.Query + " query parameter", what: "The " + from.Query + " query parameter"}, nil
	case from != nil && from.JSON != "":
		tokens, err := canonjson.ParsePointer(from.JSON)
		if err != nil {
			return keySource{}, fmt.Errorf("key_from json: %w", err)
		}
		return keySource{pointer: tokens,
			where: "the " + from.JSON + " member of its JSON body, a string", what: "The " + from.JSON + " member of the JSON body"}, nil
	}
	return keySource{header: header,
		where: "the " + header + " request header", what: "The " + header + " header"}, nil
}

// fromBody says that the key is in the body, which must be read first.
func (k *keySource) fromBody() bool { return k.pointer != nil }

// values are the key's values in r; body is r's buffered body when the key
// is in it.
func (k *keySource) values(r *http.Request, body []byte) []string {
	switch {
	case k.header != "":
		return r.Header[k.header]
	case k.query != "":
		return r.URL.Query()[k.query]
	}
	if v, ok := jsonMember(body, k.pointer); ok {
		return []string{v}
	}
	return nil
}

// jsonMember is the string at pointer in body, a JSON document; ok is
// false when body is not JSON or the member is not there.
func jsonMember(body []byte, pointer []string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return "", false
	}
	for _, tok := range pointer {
		switch node := v.(type) {
		case map[string]any:
			v = node[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(node) || tok != strconv.Itoa(i) {
				return "", false
			}
			v = node[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}
