package idempotency

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/fingerprint"
)

// keySource reads the key's values where the options say: the header's
// values, the query parameter's, or the JSON member's (none or one).
type keySource struct {
	header string                 // canonical header name; "" when the key is elsewhere
	query  string                 // query parameter
	member *fingerprint.Selection // the JSON member's pointer; nil when not from the body
	where  string                 // for the problems: "the Idempotency-Key request header"
	what   string                 // "The Idempotency-Key header"
}

func newKeySource(header string, from *app.KeyFrom) (keySource, error) {
	switch {
	case from != nil && from.Query != "":
		return keySource{query: from.Query,
			where: "the " + from.Query + " query parameter", what: "The " + from.Query + " query parameter"}, nil
	case from != nil && from.JSON != "":
		member, err := fingerprint.NewSelection([]string{from.JSON})
		if err != nil {
			return keySource{}, fmt.Errorf("key_from json: %w", err)
		}
		if slices.Contains(member.Pointers[0], "*") {
			return keySource{}, fmt.Errorf("key_from json: %s names more than one member: * matches every member, as in fingerprint_ignore", from.JSON)
		}
		return keySource{member: member,
			where: "the " + from.JSON + " member of its JSON body, a string", what: "The " + from.JSON + " member of the JSON body"}, nil
	}
	return keySource{header: header,
		where: "the " + header + " request header", what: "The " + header + " header"}, nil
}

// fromBody says that the key is in the body, which must be read first.
func (k *keySource) fromBody() bool { return k.member != nil }

// values are the key's values in r; body is r's buffered body when the key
// is in it.
func (k *keySource) values(r *http.Request, body []byte) []string {
	switch {
	case k.header != "":
		return r.Header[k.header]
	case k.query != "":
		return r.URL.Query()[k.query]
	}
	if v, ok := k.member.Member(body); ok {
		return []string{v}
	}
	return nil
}
