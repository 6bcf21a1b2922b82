package idempotency

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-idempotency/caddy-idempotency/app"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testredis"
	"github.com/caddy-idempotency/caddy-idempotency/sealing"
	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Test keys: 32 bytes each, in base64.
var (
	sealKeyA = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa1}, 32))
	sealKeyB = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xb2}, 32))
)

// secretBackend answers with marker in a header, a trailer-like header
// key and the body, so that a scan of the store can look for it.
func secretBackend(marker string) *backend {
	return &backend{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Secret", marker)
		w.Header()["Trailer:X-Checksum"] = []string{marker}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"card":%q}`, marker)
		return nil
	}}
}

func withKeys(keys ...string) func(*Handler) {
	return func(h *Handler) { h.EncryptionKeys = keys }
}

// wantSecretReplay checks that r replays what secretBackend(marker) answered.
func wantSecretReplay(t *testing.T, r response, marker string) {
	t.Helper()
	wantStatus(t, r, 201)
	if r.Header().Get("Idempotent-Replayed") != "true" || r.Header().Get("X-Secret") != marker ||
		r.Header()["Trailer:X-Checksum"][0] != marker || !strings.Contains(r.Body.String(), marker) {
		t.Fatalf("replay: headers %v, body %q; want the stored response with %q", r.Header(), r.Body, marker)
	}
}

// rawStore is a store configuration with a way to read every byte the
// store server holds, and to change a stored record behind the handler.
type rawStore struct {
	name string
	raw  json.RawMessage
	dump func(t *testing.T) []byte
	// flip changes one byte of the sealed body of key's record; nil where
	// the store's file is locked by the running store.
	flip func(t *testing.T, key store.Key)
}

func rawStores(t *testing.T) []rawStore {
	srv := testredis.Start(t)
	redisKey := func(k store.Key) string { return "idempotency:{" + k.String() + "}" }
	pg := sharedPostgres(t)
	table := fmt.Sprintf("idem_seal_%d", testSeq.Add(1))
	dsn, _ := json.Marshal(pg.DSN())
	dir := t.TempDir()
	path, _ := json.Marshal(dir)
	pgDo := func(t *testing.T, f func(c *pgx.Conn)) {
		c, err := pgx.Connect(context.Background(), pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		f(c)
	}
	return []rawStore{
		{
			name: "redis",
			raw:  json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"]}`),
			dump: func(t *testing.T) []byte {
				ctx := context.Background()
				var all []byte
				keys, err := srv.Client().Keys(ctx, "*").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					v, err := srv.Client().Get(ctx, k).Bytes()
					if err != nil {
						t.Fatalf("GET %s: %v", k, err)
					}
					all = append(append(all, k...), v...)
				}
				return all
			},
			flip: func(t *testing.T, k store.Key) {
				ctx := context.Background()
				v, err := srv.Client().Get(ctx, redisKey(k)).Bytes()
				if err != nil {
					t.Fatal(err)
				}
				v[len(v)-20] ^= 1 // in the ciphertext, before the tag
				if err := srv.Client().SetArgs(ctx, redisKey(k), v, goredis.SetArgs{KeepTTL: true}).Err(); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// the local tier holds sealed records and opens them per replay
			name: "redis_cached",
			raw:  json.RawMessage(`{"module":"redis","addresses":["` + srv.Addr() + `"],"key_prefix":"cached","local_cache":1048576}`),
			dump: func(t *testing.T) []byte {
				ctx := context.Background()
				var all []byte
				keys, err := srv.Client().Keys(ctx, "cached:*").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					if v, err := srv.Client().Get(ctx, k).Bytes(); err == nil {
						all = append(append(all, k...), v...)
					}
				}
				return all
			},
		},
		{
			name: "postgres",
			raw:  json.RawMessage(fmt.Sprintf(`{"module":"postgres","dsn":%s,"table":%q}`, dsn, table)),
			dump: func(t *testing.T) []byte {
				var all []byte
				pgDo(t, func(c *pgx.Conn) {
					rows, err := c.Query(context.Background(), `SELECT row_to_json(t)::text, coalesce(body, ''::bytea) FROM `+table+` t`)
					if err != nil {
						t.Fatal(err)
					}
					for rows.Next() {
						var text string
						var body []byte
						if err := rows.Scan(&text, &body); err != nil {
							t.Fatal(err)
						}
						all = append(append(all, text...), body...)
					}
					if err := rows.Err(); err != nil {
						t.Fatal(err)
					}
				})
				return all
			},
			flip: func(t *testing.T, k store.Key) {
				pgDo(t, func(c *pgx.Conn) {
					tag, err := c.Exec(context.Background(),
						`UPDATE `+table+` SET body = set_byte(body, length(body) - 20, get_byte(body, length(body) - 20) # 1) WHERE state = 'completed'`)
					if err != nil || tag.RowsAffected() != 1 {
						t.Fatalf("flipping a byte: %v, %d rows", err, tag.RowsAffected())
					}
				})
			},
		},
		{
			name: "file",
			raw:  json.RawMessage(`{"module":"file","path":` + string(path) + `}`),
			dump: func(t *testing.T) []byte {
				b, err := os.ReadFile(filepath.Join(dir, "idempotency.db"))
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
		},
	}
}

// A response with a marker is replayed whole, and the store's server holds
// no trace of the marker; without keys, the same scan finds it, so the scan
// does look where the response is.
func TestSealedResponsesUnreadableInStore(t *testing.T) {
	for _, rs := range rawStores(t) {
		t.Run(rs.name, func(t *testing.T) {
			const sealed, plain = "SEALED-4111111111111111", "PLAIN-5500000000000004"
			h := provision(t, rs.raw, withKeys(sealKeyA))
			b := secretBackend(sealed)
			wantStatus(t, do(h, b, post("/cards", "k-sealed", `{}`)), 201)
			wantSecretReplay(t, do(h, b, post("/cards", "k-sealed", `{}`)), sealed)
			if b.runs.Load() != 1 {
				t.Fatalf("%d runs, want 1", b.runs.Load())
			}

			clear := provision(t, rs.raw, nil)
			wantStatus(t, do(clear, secretBackend(plain), post("/cards", "k-plain", `{}`)), 201)
			dump := rs.dump(t)
			if !bytes.Contains(dump, []byte(plain)) {
				t.Fatalf("the scan of %d bytes does not find the unsealed marker: it looks in the wrong place", len(dump))
			}
			if bytes.Contains(dump, []byte(sealed)) {
				t.Fatalf("the store holds the sealed response's marker in the clear")
			}
		})
	}
}

// Rotation: a handler with the new key first and the old second replays
// the old key's records; one without the old key refuses them, 500, and
// runs nothing. The old key's id is in the log and the refusal counted.
func TestSealingKeyRotation(t *testing.T) {
	eachStore(t, func(t *testing.T, raw json.RawMessage) {
		old := provision(t, raw, withKeys(sealKeyA))
		b := secretBackend("rotated-secret")
		wantStatus(t, do(old, b, post("/r", "k-rot", `{}`)), 201)

		rotated := provision(t, raw, withKeys(sealKeyB, sealKeyA))
		wantSecretReplay(t, do(rotated, b, post("/r", "k-rot", `{}`)), "rotated-secret")
		// the rotated handler seals with the new key
		wantStatus(t, do(rotated, b, post("/r", "k-new", `{}`)), 201)

		dropped := provision(t, raw, withKeys(sealKeyB))
		logs := watchLogs(dropped)
		before := testutil.ToFloat64(collectors.unreadable.WithLabelValues("unknown_key"))
		wantProblem(t, do(dropped, b, post("/r", "k-rot", `{}`)), 500, "The stored response for this Idempotency-Key cannot be read")
		wantSecretReplay(t, do(dropped, b, post("/r", "k-new", `{}`)), "rotated-secret")
		if b.runs.Load() != 2 {
			t.Fatalf("%d runs, want 2: a refused record ran again", b.runs.Load())
		}
		if got := testutil.ToFloat64(collectors.unreadable.WithLabelValues("unknown_key")) - before; got != 1 {
			t.Fatalf("unreadable_records_total{reason=unknown_key} grew by %v, want 1", got)
		}
		wantUnreadableLog(t, logs, "unknown_key", old.keys.IDs()[0])

		// A handler without any key refuses sealed records too: it never
		// replays ciphertext.
		none := provision(t, raw, nil)
		r := do(none, b, post("/r", "k-rot", `{}`))
		wantProblem(t, r, 500, "The stored response for this Idempotency-Key cannot be read")
		if b.runs.Load() != 2 {
			t.Fatalf("%d runs, want 2", b.runs.Load())
		}
		// A request with another payload still gets 422, sealed or not.
		wantProblem(t, do(dropped, b, post("/r", "k-rot", `{"other":1}`)), 422, "Idempotency-Key is already used")
	})
}

func wantUnreadableLog(t *testing.T, logs *observer.ObservedLogs, reason, keyID string) {
	t.Helper()
	for _, e := range logs.All() {
		f := e.ContextMap()
		if f["reason"] == reason && f["key_id"] == keyID && f["key_hash"] != nil {
			return
		}
	}
	t.Fatalf("no log of the refusal with reason %s and key_id %s in %v", reason, keyID, logs.All())
}

// A flipped byte in a stored record, or a record copied under another
// key, fails authentication: refused, not run again.
func TestSealedRecordTampered(t *testing.T) {
	for _, rs := range rawStores(t) {
		if rs.flip == nil {
			continue // the file store's database is locked while it runs
		}
		t.Run(rs.name, func(t *testing.T) {
			h := provision(t, rs.raw, withKeys(sealKeyA))
			logs := watchLogs(h)
			b := secretBackend("tamper-me")
			req := post("/t", "k-tamper", `{}`)
			wantStatus(t, do(h, b, req), 201)
			rs.flip(t, store.NewKey("", "k-tamper"))
			before := testutil.ToFloat64(collectors.unreadable.WithLabelValues("authentication"))
			wantProblem(t, do(h, b, post("/t", "k-tamper", `{}`)), 500, "The stored response for this Idempotency-Key cannot be read")
			if b.runs.Load() != 1 {
				t.Fatalf("%d runs, want 1: a tampered record ran again", b.runs.Load())
			}
			if got := testutil.ToFloat64(collectors.unreadable.WithLabelValues("authentication")) - before; got != 1 {
				t.Fatalf("unreadable_records_total{reason=authentication} grew by %v, want 1", got)
			}
			wantUnreadableLog(t, logs, "authentication", h.keys.IDs()[0])
		})
	}
}

// Keys come from placeholders, and bad ones are refused at provision
// with an error that names the key by position, never by value.
func TestEncryptionKeysConfig(t *testing.T) {
	t.Setenv("IDEMPOTENCY_TEST_KEY", sealKeyA)
	secret := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(secret, []byte(sealKeyB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ring, err := sealing.NewKeyring([]string{"{env.IDEMPOTENCY_TEST_KEY}", "{file." + secret + "}"})
	if err != nil {
		t.Fatal(err)
	}
	direct, _ := sealing.NewKeyring([]string{sealKeyA, sealKeyB})
	if fmt.Sprint(ring.IDs()) != fmt.Sprint(direct.IDs()) {
		t.Fatalf("placeholder keys %v, want %v", ring.IDs(), direct.IDs())
	}

	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{[]string{"{env.IDEMPOTENCY_TEST_UNSET}"}, "key 1 is empty"},
		{[]string{sealKeyA, "not base64!"}, "key 2 is not base64"},
		{[]string{short}, "key 1 decodes to 16 bytes, want 32"},
		{[]string{sealKeyA, sealKeyA}, "key 2 repeats key 1"},
	} {
		h := &Handler{Options: app.Options{StoreRaw: storeConfigs[0].raw(t), EncryptionKeys: tc.keys}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keys %v: %v, want an error with %q", tc.keys, err, tc.want)
			continue
		}
		for _, k := range tc.keys {
			if strings.Contains(err.Error(), k) {
				t.Errorf("error %q prints a key", err)
			}
		}
	}
}

// The option in both Caddyfile places, adapted to JSON, and inherited from
// the app by the routes that set no keys of their own.
func TestEncryptionKeysCaddyfileAndInheritance(t *testing.T) {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`{
	idempotency {
		encryption_keys {env.IDEMPOTENCY_NEW} {file./run/secrets/old}
	}
}

:8080 {
	idempotency /own/* {
		encryption_keys {env.ROUTE_KEY}
	}
	idempotency /inherit/*
	respond "ok"
}`), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, want := range []string{
		`"idempotency":{"encryption_keys":["{env.IDEMPOTENCY_NEW}","{file./run/secrets/old}"]}`,
		`"encryption_keys":["{env.ROUTE_KEY}"],"handler":"idempotency"`,
	} {
		if !strings.Contains(string(cfgJSON), want) {
			t.Errorf("adapted config lacks %s:\n%s", want, cfgJSON)
		}
	}
	d := caddyfile.NewTestDispenser(`idempotency {
		encryption_keys
	}`)
	if err := new(Handler).UnmarshalCaddyfile(d); err == nil || !strings.Contains(err.Error(), "encryption_keys: expected at least one value") {
		t.Errorf("encryption_keys without a key: %v", err)
	}

	appKeys, _ := json.Marshal([]string{sealKeyB, sealKeyA})
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{
		"idempotency": json.RawMessage(`{"encryption_keys":` + string(appKeys) + `}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	global, _ := sealing.NewKeyring([]string{sealKeyB, sealKeyA})
	own, _ := sealing.NewKeyring([]string{sealKeyA})
	for _, tc := range []struct {
		keys []string
		want []string
	}{
		{nil, global.IDs()},
		{[]string{sealKeyA}, own.IDs()},
	} {
		ctx, cancel := caddy.NewContext(base)
		h := Handler{Options: app.Options{EncryptionKeys: tc.keys, StoreRaw: storeConfigs[0].raw(t)}}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(h.keys.IDs()) != fmt.Sprint(tc.want) {
			t.Errorf("route with keys %d: key ids %v, want %v", len(tc.keys), h.keys.IDs(), tc.want)
		}
		cancel()
	}
}
