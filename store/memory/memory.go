// Package memory is the embedded idempotency store: a bounded table inside
// the Caddy process, not shared between instances and forgotten when the
// process exits.
package memory

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/internal/table"
)

func init() {
	caddy.RegisterModule(Memory{})
}

const (
	defaultMaxEntries = 100_000
	defaultMaxBytes   = 256 << 20
	// recordShare bounds one record to a quarter of max_bytes, so that
	// completing it never evicts more than a quarter of the others.
	recordShare = 4
)

// now is replaceable in tests.
var now = time.Now

// tables keeps the tables across config reloads, which must not forget
// keys: a table is the store's name's, whatever limits a reload gives it.
var tables = caddy.NewUsagePool()

// shared is one table, as large as the largest limits that the stores
// using it give it: during a reload that changes them, the old config's
// and the new one's; once the old one is cleaned up, the new one's.
type shared struct {
	*table.Table
	mu     sync.Mutex
	limits map[*Memory][2]int64 // entries, bytes
}

func (s *shared) join(m *Memory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits[m] = [2]int64{int64(m.MaxEntries), m.MaxBytes}
	s.apply()
}

func (s *shared) leave(m *Memory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.limits, m)
	if len(s.limits) > 0 {
		s.apply()
	}
}

// apply sets the table's limits to the largest given; s.mu is held.
func (s *shared) apply() {
	var largest [2]int64
	for _, l := range s.limits {
		largest = [2]int64{max(largest[0], l[0]), max(largest[1], l[1])}
	}
	s.Lock()
	s.SetLimits(int(largest[0]), largest[1])
	s.Unlock()
}

// evictions is process-wide, like the tables, and registered into each
// config's registry.
var evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "idempotency", Name: "store_evictions_total",
	Help: "Completed records that the memory store evicted to make room before their ttl passed, by store: a retry of one runs the request again.",
}, []string{"store"})

// Memory keeps idempotency records in the Caddy process. When full, the
// oldest completed records are evicted first; in-flight claims never are.
type Memory struct {
	// Name is the store's table, and what operators call it: `caddy
	// idempotency stores` lists it, the admin API's store= and the
	// command's --store choose it, and the metrics and traces carry it.
	// Store blocks with one name share one table; within one config they
	// must give it the same limits, and a reload may change them without
	// losing a key. Default: "memory".
	Name string `json:"name,omitempty"`

	// MaxEntries bounds the number of records kept, at most 1073741824.
	// Default: 100000.
	MaxEntries int `json:"max_entries,omitempty"`
	// MaxBytes bounds the memory that stored responses may use, in bytes.
	// Default: 268435456 (256 MiB).
	MaxBytes int64 `json:"max_bytes,omitempty"`

	tab       *table.Table
	shared    *shared
	maxRecord int64 // the largest blob Complete keeps
	evicted   prometheus.Counter
	poolKey   string // cleared by Cleanup
	name      string // in the store registry
}

// CaddyModule returns the Caddy module information.
func (Memory) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.stores.memory",
		New: func() caddy.Module { return new(Memory) },
	}
}

// Provision sets defaults and attaches to the process-wide table with the
// same limits, creating it if needed.
func (m *Memory) Provision(ctx caddy.Context) error {
	if m.MaxEntries == 0 {
		m.MaxEntries = defaultMaxEntries
	}
	if m.MaxBytes == 0 {
		m.MaxBytes = defaultMaxBytes
	}
	m.name = cmp.Or(m.Name, defaultName)
	m.poolKey = "memory/" + m.name
	val, _, err := tables.LoadOrNew(m.poolKey, func() (caddy.Destructor, error) {
		return &shared{Table: table.New(m.MaxEntries, m.MaxBytes), limits: make(map[*Memory][2]int64)}, nil
	})
	if err != nil {
		m.poolKey = ""
		return err
	}
	m.shared = val.(*shared)
	m.shared.join(m)
	m.tab = m.shared.Table
	m.maxRecord = m.MaxBytes/recordShare - table.Size(nil)
	// The registry refuses one name with two limits in one config.
	records := fmt.Sprintf("memory table '%s' of %d records, %s", m.name, m.MaxEntries, exactSize(m.MaxBytes))
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(evictions); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	m.evicted = evictions.WithLabelValues(m.name) // exported at 0 from the start
	// On error, Caddy's call of Cleanup gives the table back.
	return store.Register(ctx.Context, store.Registration{Name: m.name, Module: "memory", Store: m}, records)
}

// MaxRecordBytes is a quarter of max_bytes, less what the table counts
// beside a record's encoding.
func (m *Memory) MaxRecordBytes() int64 { return m.maxRecord }

// Validate checks the limits.
func (m *Memory) Validate() error {
	if m.MaxEntries < 0 || m.MaxEntries > table.MaxEntries {
		return fmt.Errorf("max_entries must be between 0 and %d: %d", table.MaxEntries, m.MaxEntries)
	}
	if m.MaxBytes < 0 {
		return fmt.Errorf("max_bytes must not be negative: %d", m.MaxBytes)
	}
	return nil
}

// Cleanup detaches from the table; the last user stops its sweeper once
// the requests that hold this store are done (store.Holds).
func (m *Memory) Cleanup() error {
	if m.shared != nil {
		m.shared.leave(m)
	}
	return store.Detach(m, m.name, tables, &m.poolKey)
}

// Interface guards
var (
	_ caddy.Provisioner  = (*Memory)(nil)
	_ caddy.Validator    = (*Memory)(nil)
	_ caddy.CleanerUpper = (*Memory)(nil)

	_ store.RecordLimit = (*Memory)(nil)
)
