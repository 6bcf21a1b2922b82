package idempotency

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testpg"
)

// One PostgreSQL server serves every handler test; each test gets a table
// of its own. initdb costs seconds, a table costs milliseconds.
var (
	pgOnce   sync.Once
	pgServer *testpg.Server
	pgErr    error
)

func sharedPostgres(t testing.TB) *testpg.Server {
	pgOnce.Do(func() { pgServer, pgErr = testpg.New() })
	if pgErr != nil {
		t.Fatalf("starting PostgreSQL: %v", pgErr)
	}
	return pgServer
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pgServer != nil {
		pgServer.Close()
	}
	os.Exit(code)
}

func init() {
	storeConfigs = append(storeConfigs,
		struct {
			name string
			raw  func(t *testing.T) json.RawMessage
		}{"postgres", func(t *testing.T) json.RawMessage {
			dsn, _ := json.Marshal(sharedPostgres(t).DSN())
			return json.RawMessage(fmt.Sprintf(`{"module":"postgres","dsn":%s,"table":"idem_%d"}`, dsn, testSeq.Add(1)))
		}},
		struct {
			name string
			raw  func(t *testing.T) json.RawMessage
		}{"file", func(t *testing.T) json.RawMessage {
			path, _ := json.Marshal(t.TempDir())
			return json.RawMessage(`{"module":"file","path":` + string(path) + `}`)
		}},
	)
}
