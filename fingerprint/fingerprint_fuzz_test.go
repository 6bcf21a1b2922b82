package fingerprint

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// FuzzQueryAsSet checks the json mode's query parser against net/url: a
// query whose components net/url decodes has the fingerprint of its
// parameters re-encoded by net/url in sorted order, and swapping two
// distinct values of one name changes it.
func FuzzQueryAsSet(f *testing.F) {
	for _, q := range []string{"", "a=1&b=2", "b=2&a=1&a=0", "q=a+b&r=%2B", "a&&b=", "a=%zz", "%C3%A9=%e2%82%ac", "x=1;y=2"} {
		f.Add(q)
	}
	p := &Payload{mode: modeJSON}
	fp := func(q string) any {
		return p.Of(&http.Request{URL: &url.URL{RawQuery: q}, Header: http.Header{}}, nil)
	}
	f.Fuzz(func(t *testing.T, q string) {
		got := fp(q)
		type kv struct{ k, v string }
		var params []kv
		for pair := range strings.SplitSeq(q, "&") {
			if pair == "" {
				continue
			}
			k, v, _ := strings.Cut(pair, "=")
			dk, err1 := url.QueryUnescape(k)
			dv, err2 := url.QueryUnescape(v)
			if err1 != nil || err2 != nil {
				return // kept raw: nothing to compare with
			}
			params = append(params, kv{dk, dv})
		}
		slices.SortStableFunc(params, func(a, b kv) int { return strings.Compare(a.k, b.k) })
		var enc []string
		for _, p := range params {
			enc = append(enc, url.QueryEscape(p.k)+"="+url.QueryEscape(p.v))
		}
		if again := fp(strings.Join(enc, "&")); again != got {
			t.Fatalf("%q and its sorted re-encoding %q differ", q, strings.Join(enc, "&"))
		}
		for i := 1; i < len(params); i++ {
			if params[i].k == params[i-1].k && params[i].v != params[i-1].v {
				enc[i], enc[i-1] = enc[i-1], enc[i]
				if fp(strings.Join(enc, "&")) == got {
					t.Fatalf("%q: swapping two values of %q keeps the fingerprint", q, params[i].k)
				}
				return
			}
		}
	})
}
