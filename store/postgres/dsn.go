package postgres

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// keywordPassword matches a keyword=value password (sslpassword too),
// spaces around the = included, as libpq allows them.
var keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlQueryPassword matches a password in a URL's query.
var urlQueryPassword = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)([^&#]*)`)

// redactDSN hides the password of a URL or keyword=value DSN. Placeholders
// are not secrets until resolved.
func redactDSN(dsn string) string {
	scheme, rest, isURL := strings.Cut(dsn, "://")
	if !isURL {
		return keywordPassword.ReplaceAllString(dsn, "${1}xxxxx")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		// Perhaps a character in the password: hide all before the host.
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = "xxxxx" + rest[i:]
		}
		return scheme + "://" + urlQueryPassword.ReplaceAllString(rest, "${1}xxxxx")
	}
	q := u.Query()
	for _, key := range []string{"password", "sslpassword"} {
		if q.Has(key) {
			q.Set(key, "xxxxx")
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}

// dsnError reports that dsn does not parse, with pgx's reason but never
// the password. pgx quotes the DSN in its error, redacted on a best-effort
// basis that misses spellings such as "password = secret", and its
// ConnString holds the DSN as written: the error quotes the DSN as
// redactDSN shows it, does not wrap pgx's, and drops a reason that would
// still show a password.
func dsnError(dsn string, err error) error {
	shown, reason := redactDSN(dsn), err.Error()
	var parseErr *pgconn.ParseConfigError
	if errors.As(err, &parseErr) {
		redacted := *parseErr
		redacted.ConnString = shown
		reason = redacted.Error()
	}
	// Each fallback says less: the first that shows no password stands.
	for _, fallback := range []string{
		keywordPassword.ReplaceAllString(reason, "${1}xxxxx"),
		"cannot parse `" + shown + "` (pgx's reason is left out: it shows the password)",
		"cannot parse it (neither it nor pgx's reason is shown: they show the password)",
	} {
		if !showsPassword(dsn, reason) {
			break
		}
		reason = fallback
	}
	return errors.New("parsing dsn: " + reason)
}

func showsPassword(dsn, text string) bool {
	for _, pw := range passwordSpellings(dsn) {
		if strings.Contains(text, pw) {
			return true
		}
	}
	return false
}

// passwordSpellings returns dsn's passwords as an error might quote them:
// as written, unquoted, unescaped and Go-quoted.
func passwordSpellings(dsn string) []string {
	var written []string
	for _, m := range keywordPassword.FindAllStringSubmatch(dsn, -1) {
		written = append(written, m[2], strings.Trim(m[2], "'"))
	}
	if _, rest, isURL := strings.Cut(dsn, "://"); isURL {
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				written = append(written, pw)
			}
		}
		for _, m := range urlQueryPassword.FindAllStringSubmatch(rest, -1) {
			written = append(written, m[2])
		}
	}
	var spellings []string
	for _, pw := range written {
		if pw == "" {
			continue
		}
		spellings = append(spellings, pw)
		if unescaped, err := url.PathUnescape(pw); err == nil && unescaped != pw {
			spellings = append(spellings, unescaped)
		}
		if quoted := strconv.Quote(pw); quoted[1:len(quoted)-1] != pw {
			spellings = append(spellings, quoted[1:len(quoted)-1])
		}
	}
	return spellings
}
