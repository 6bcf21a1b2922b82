package admin

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "idempotency",
		Usage: "inspect|purge|stuck|stores [--address <interface>] [--store <name>] [--json]",
		Short: "Inspects and purges the idempotency keys of a running Caddy",
		Long: `
Looks up, purges and lists the records of the idempotency handler's stores,
through the admin API of a running Caddy (its admin.api.idempotency routes).

  caddy idempotency stores
  caddy idempotency inspect order-1
  caddy idempotency inspect order-1 --scope <scope>
  caddy idempotency inspect --hash <64 hex digits>
  caddy idempotency purge   order-1 --scope <scope>
  caddy idempotency stuck   --older-than 1m --limit 50

The key is the client's Idempotency-Key (the argument, or --key) and the
scope what the route's scope template expanded to for that client (the
authenticated user by default, empty on routes without authentication); or
give the key's hash, as the {http.idempotency.key} placeholder logs it.
The key and scope are hashed here: only the hash reaches the admin API,
whose log records every request's URI.

--store chooses the store when the running configs use several: its name
as 'stores' lists it, or its module name (memory, redis, file, postgres) if
only one store of that module is used. --json prints the API's answer.

Stored bodies and headers are never shown.
`,
		CobraFunc: setupCommand,
	})
}

// cliOptions are the flags common to every subcommand.
type cliOptions struct {
	address, config, adapter, store string
	json                            bool
	out                             io.Writer
}

func setupCommand(cmd *cobra.Command) {
	opts := &cliOptions{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&opts.address, "address", "", "The address of Caddy's admin API (default: from --config, else localhost:2019)")
	pf.StringVarP(&opts.config, "config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	pf.StringVarP(&opts.adapter, "adapter", "a", "", "Name of the config adapter to apply (when --config is used)")
	pf.StringVar(&opts.store, "store", "", "The store to use, as 'stores' lists it, when the config uses several")
	pf.BoolVar(&opts.json, "json", false, "Print the admin API's JSON answer")

	keyCmd := func(sub, short string, do func(context.Context, keyRef) error) *cobra.Command {
		var k keyFlags
		c := &cobra.Command{
			Use:   sub + " <key> [--scope <scope>] | --hash <hash>",
			Short: short,
			Args:  oneKeyArg(sub),
			RunE: func(c *cobra.Command, args []string) error {
				return opts.run(c, func(ctx context.Context) error {
					ref, err := k.path(args, sub)
					if err != nil {
						return err
					}
					return do(ctx, ref)
				})
			},
		}
		k.add(c)
		return c
	}
	inspect := keyCmd("inspect", "Shows the record of a key: state, endpoint, status, age, expiry, body size", opts.inspect)
	purge := keyCmd("purge", "Deletes the record of a key, whatever its state: the next request with the key runs anew", opts.purge)

	var olderThan string
	var limit int
	stuck := &cobra.Command{
		Use:   "stuck [--older-than <duration>] [--limit <n>]",
		Short: "Lists the claims in flight for longer than a given age, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return opts.run(c, func(ctx context.Context) error { return opts.stuck(ctx, olderThan, limit) })
		},
	}
	stuck.Flags().StringVar(&olderThan, "older-than", defaultOlderThan.String(), "List claims made at least this long ago")
	stuck.Flags().IntVar(&limit, "limit", defaultStuckLimit, "List at most this many claims")

	stores := &cobra.Command{
		Use:   "stores",
		Short: "Lists the stores of the running configs",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return opts.run(c, opts.stores)
		},
	}
	cmd.AddCommand(inspect, purge, stuck, stores)
}

func keyUsage(sub string) string {
	return "caddy idempotency " + sub + " <key> [--scope <scope>], or --hash <hash>"
}

// oneKeyArg refuses more than one argument (the client's key).
func oneKeyArg(sub string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 1 {
			return fmt.Errorf("give one key, not %d words: %s; quote a key that holds spaces", len(args), keyUsage(sub))
		}
		return nil
	}
}

// keyFlags name a key by its hash, or by the client's key and its scope.
type keyFlags struct{ hash, key, scope string }

func (k *keyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.hash, "hash", "", "The key's hash, 64 hex digits (as {http.idempotency.key} logs it)")
	cmd.Flags().StringVar(&k.key, "key", "", "The client's Idempotency-Key; may also be given as the argument")
	cmd.Flags().StringVar(&k.scope, "scope", "", "The scope the key was used in (the route's scope, by default the authenticated user)")
	cmd.MarkFlagsMutuallyExclusive("hash", "key")
	cmd.MarkFlagsMutuallyExclusive("hash", "scope")
}

// keyRef is a key's API path, and a hint for when it has no record.
type keyRef struct{ path, hint string }

// path returns the key's API path. It hashes key and scope as the handler
// does (store.NewKey), so that neither leaves this process.
func (k *keyFlags) path(args []string, sub string) (keyRef, error) {
	clientKey := k.key
	if len(args) == 1 {
		if k.hash != "" || k.key != "" {
			return keyRef{}, fmt.Errorf("give the key once: as the argument, --hash or --key; %s", keyUsage(sub))
		}
		clientKey = args[0]
	}
	switch {
	case k.hash != "":
		return keyRef{path: adminBase + "keys/" + url.PathEscape(strings.ToLower(k.hash))}, nil
	case clientKey == "":
		return keyRef{}, errors.New("which key? " + keyUsage(sub))
	}
	parsed, ok := store.ParseClientKey(clientKey)
	if !ok {
		return keyRef{}, errors.New("not a valid Idempotency-Key (1 to 255 visible ASCII characters, bare or as a quoted string)")
	}
	ref := keyRef{path: adminBase + "keys/" + store.NewKey(k.scope, parsed).String()}
	if isKeyHash(clientKey) {
		ref.hint = fmt.Sprintf("if %s… is a key hash from a log, use --hash %s", clientKey[:8], clientKey)
	}
	return ref, nil
}

func isKeyHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func (o *cliOptions) run(c *cobra.Command, f func(context.Context) error) error {
	o.out = c.OutOrStdout()
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout+5*time.Second)
	defer cancel()
	return f(ctx)
}

func (o *cliOptions) inspect(ctx context.Context, ref keyRef) error {
	var info KeyInfo
	raw, err := o.call(ctx, http.MethodGet, ref.path, nil, &info)
	if err = ref.explain(err); err != nil || o.json {
		return o.printJSON(raw, err)
	}
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("store", info.Store)
	row("key", info.Key)
	row("state", info.State)
	row("endpoint", printable(info.Endpoint))
	answered := info.State == "completed" && !info.OutcomeUnknown
	if answered {
		row("status", strconv.Itoa(info.Status))
	}
	if info.OutcomeUnknown {
		row("outcome", "unknown: the request was sent upstream and got no answer; retries get 502")
	}
	row("created", fmt.Sprintf("%s (%s ago)", info.CreatedAt.Format(time.RFC3339), shortDuration(info.Age)))
	if info.ExpiresAt != nil {
		what := "expires"
		if info.State == "in_progress" {
			what = "lease ends"
		}
		row(what, fmt.Sprintf("%s (in %s)", info.ExpiresAt.Format(time.RFC3339), shortDuration(info.ExpiresIn)))
	} else {
		row("expires", "never")
	}
	if answered {
		row("body", fmt.Sprintf("%d bytes", info.BodySize))
		row("replayable", yesNo(!info.Truncated))
	}
	return tw.Flush()
}

func (o *cliOptions) purge(ctx context.Context, ref keyRef) error {
	var p Purged
	raw, err := o.call(ctx, http.MethodDelete, ref.path, nil, &p)
	if err = ref.explain(err); err != nil || o.json {
		return o.printJSON(raw, err)
	}
	_, err = fmt.Fprintf(o.out, "purged %s from %s\n", p.Key, p.Store)
	return err
}

func (k keyRef) explain(err error) error {
	if err != nil && k.hint != "" && strings.Contains(err.Error(), "no record") {
		return fmt.Errorf("%w (%s)", err, k.hint)
	}
	return err
}

func (o *cliOptions) stuck(ctx context.Context, olderThan string, limit int) error {
	q := url.Values{"older_than": {olderThan}, "limit": {strconv.Itoa(limit)}}
	var list StuckList
	raw, err := o.call(ctx, http.MethodGet, adminBase+"stuck", q, &list)
	if err != nil || o.json {
		return o.printJSON(raw, err)
	}
	if len(list.Claims) == 0 {
		_, err := fmt.Fprintf(o.out, "no claim in flight for %s or longer in %s\n", shortDuration(list.OlderThan), list.Store)
		return err
	}
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tAGE\tLEASE ENDS IN\tENDPOINT")
	for _, c := range list.Claims {
		lease := "never"
		if c.ExpiresAt != nil {
			lease = shortDuration(c.ExpiresIn)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Key, shortDuration(c.Age), lease, printable(c.Endpoint))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(list.Claims) == list.Limit {
		_, err := fmt.Fprintf(o.out, "(the first %d; there may be more: raise --limit)\n", list.Limit)
		return err
	}
	return nil
}

func (o *cliOptions) stores(ctx context.Context) error {
	var list []StoreInfo
	raw, err := o.call(ctx, http.MethodGet, adminBase+"stores", nil, &list)
	if err != nil || o.json {
		return o.printJSON(raw, err)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(o.out, "no idempotency store is provisioned")
		return err
	}
	tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODULE")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Module)
	}
	return tw.Flush()
}

// printJSON prints the API's answer indented, unless the call failed.
func (o *cliOptions) printJSON(raw []byte, err error) error {
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		buf.Reset()
		buf.Write(raw)
	}
	if !bytes.HasSuffix(buf.Bytes(), []byte("\n")) {
		buf.WriteByte('\n')
	}
	_, err = o.out.Write(jsonPrintable(buf.Bytes()))
	return err
}

// jsonPrintable escapes, as JSON does, the characters that the API's
// encoder leaves raw in strings but that would act on a terminal (C1
// controls, bidirectional overrides and other format characters), as
// printable does for the tables. Outside strings an indented answer holds
// only printable characters, spaces and newlines.
func jsonPrintable(b []byte) []byte {
	var out []byte
	for _, r := range string(b) {
		switch {
		case r == '\n' || unicode.IsPrint(r):
			out = utf8.AppendRune(out, r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}

// call sends a request to the admin API, with the store parameter, and
// decodes a success into v; otherwise the error carries the API's message.
func (o *cliOptions) call(ctx context.Context, method, path string, q url.Values, v any) ([]byte, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(o.address, nil, o.config, o.adapter)
	if err != nil {
		return nil, fmt.Errorf("finding the admin API's address: %w", err)
	}
	if o.store != "" {
		if q == nil {
			q = url.Values{}
		}
		q.Set("store", o.store)
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := adminRequest(ctx, addr, method, path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the admin API's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var apiErr struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &apiErr) == nil && apiErr.Error != "" {
			return nil, errors.New(apiErr.Error)
		}
		if resp.StatusCode == http.StatusNotFound && !strings.Contains(resp.Header.Get("Content-Type"), "json") {
			return nil, fmt.Errorf("%s answered 404 for %s: is this Caddy built with the idempotency module?", addr, path)
		}
		return nil, fmt.Errorf("%s answered %s: %s", addr, resp.Status, bytes.TrimSpace(raw))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("decoding the admin API's answer: %w", err)
	}
	return raw, nil
}

// adminRequest calls the admin API at addr, a TCP or unix socket address,
// with the Origin it requires of TCP clients, as caddycmd.AdminAPIRequest.
func adminRequest(ctx context.Context, addr, method, path string) (*http.Response, error) {
	parsed, err := caddy.ParseNetworkAddress(addr)
	if err == nil && parsed.PortRangeSize() > 1 {
		err = errors.New("a port range")
	}
	if err != nil {
		return nil, fmt.Errorf("invalid admin address %s: %v", addr, err)
	}
	origin := "http://" + parsed.JoinHostPort(0)
	socket := parsed.IsUnixNetwork() || parsed.IsFdNetwork()
	if socket {
		origin = "http://127.0.0.1" // a placeholder: the dial goes to the socket
		// a unix address may end with |<permission bits>
		if i := strings.LastIndexByte(parsed.Host, '|'); i >= 0 {
			parsed.Host = parsed.Host[:i]
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, origin+path, nil)
	if err != nil {
		return nil, fmt.Errorf("making request: %w", err)
	}
	if !socket {
		req.Header.Set("Origin", origin)
	}
	client := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, parsed.Network, parsed.JoinHostPort(0))
		},
	}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("calling the admin API at %s (is Caddy running, with its admin API there?): %w", addr, err)
	}
	return resp, nil
}

// shortDuration rounds an API duration of 1s or more to seconds: 1h, 2m30s.
func shortDuration(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return s
	}
	s = d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no (its response was over max_response_body or broke off: retries get 409)"
}

// printable is s for a terminal: the endpoint is what a client sent, and
// control and format characters (escape sequences, a carriage return,
// bidirectional overrides) would act on the operator's terminal. They, and
// the backslash that would make an escape ambiguous, are written as Go
// escapes.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}
