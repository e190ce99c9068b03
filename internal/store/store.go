// Package store owns the PostgreSQL connection, the schema migrations and
// transactions. Everything else reaches the database through a Store: it
// runs sqlc's typed queries (gen/db) on the pool or inside WithTx, and it
// refuses to migrate a database that a newer build has migrated.
package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"computeplane/gen/db"
)

// ErrNotFound is returned, possibly wrapped, when a row the caller asked for
// does not exist.
var ErrNotFound = errors.New("store: not found")

// MapNoRows turns pgx.ErrNoRows into ErrNotFound and returns every other
// error (nil included) unchanged, so that callers need not know about pgx.
func MapNoRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// Visible answers a read of one row for a caller who may see only some rows
// (a tenant's own, a live one): no row, or a row visible says the caller
// may not see, is notFound, so the two cannot be told apart; any other
// error passes. visible is computed by the caller from row (zero when err
// is set), as in
//
//	r, err := q.GetVolume(ctx, id)
//	return store.Visible(r, err, r.TenantID == tenant, notFound(id))
func Visible[T any](row T, err error, visible bool, notFound error) (T, error) {
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !visible) {
		var zero T
		return zero, notFound
	}
	return row, err
}

// Store is a pool of connections to one PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	// reads runs WithTx's reads (reads.go); nil on a Sibling, whose reads
	// take a READ ONLY transaction on pool.
	reads   *pgxpool.Pool
	queries *db.Queries
	// pools is every pool opened from the same Open, reset together
	// when a statement finds the server gone (reset.go).
	pools *poolSet
}

// Pool bounds used when the URL does not set pool_max_conns. Every call of
// the api role holds one connection for its transaction, so the pool scales
// with the CPUs that run those calls, within what a PostgreSQL with the
// default max_connections (100) can give to several processes.
const (
	minPoolConns       = 8
	maxPoolConns       = 32
	poolConnsPerCPU    = 4
	poolMaxConnIdle    = 5 * time.Minute
	applicationNameKey = "application_name"
	applicationName    = "computed"
)

// PingAfterIdle is how long a connection may sit idle in a pool before
// the pool pings it (a round trip) when handing it out. pgxpool pings
// after 1 s, which puts an extra round trip (and a goroutine) on the
// path of every call of a process that serves less than one call a
// second per connection: instances.create in make bench-instances paid
// 0.25 ms at p50 and up to 3 ms for it (docs/benchmarks-notes.md).
// A connection the server closed in the meantime fails its call, which
// is answered UNAVAILABLE with a retry hint (as for any connection the
// server drops in use, which no ping catches either), and that fault
// resets every pool (reset.go): after a restart or a failover one call
// fails, not one per idle connection.
const PingAfterIdle = 5 * time.Second

// Open connects to the database at url (a postgres:// URL or a key=value
// string, as pgx accepts) and checks that it answers. The pool size comes
// from pool_max_conns in the URL when present.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, errors.New("store: invalid database URL")
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = int32(min(max(poolConnsPerCPU*runtime.GOMAXPROCS(0), minPoolConns), maxPoolConns))
	}
	pools := newPoolSet()
	if cfg.ConnConfig.Tracer == nil {
		cfg.ConnConfig.Tracer = roundTripTracer{pools: pools}
	}
	if !strings.Contains(url, "pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = poolMaxConnIdle
	}
	// Statements run in pgx's default mode, which caches prepared
	// statements and never reads the description cache; pgx would still
	// give each connection an empty 512-entry map for it, pointers the
	// collector marks on every cycle. (A statement sent in the describe
	// mode would now fail at once, not run uncached.)
	if !strings.Contains(url, "description_cache_capacity") {
		cfg.ConnConfig.DescriptionCacheCapacity = 0
	}
	// Every pool made from cfg (the read pool, the siblings) inherits it.
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > PingAfterIdle }
	if _, ok := cfg.ConnConfig.RuntimeParams[applicationNameKey]; !ok {
		cfg.ConnConfig.RuntimeParams[applicationNameKey] = applicationName
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	reads, err := openReads(ctx, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	pools.add(pool)
	pools.add(reads)
	return &Store{pool: pool, reads: reads, queries: db.New(pool), pools: pools}, nil
}

// Sibling opens a second pool to the same database, of at most maxConns
// connections, named name in pg_stat_activity. Background work runs on its
// own pools so that API load, however heavy, can never keep a worker from
// renewing its leases. It connects lazily.
func (s *Store) Sibling(ctx context.Context, name string, maxConns int32) (*Store, error) {
	cfg := s.pool.Config() // a copy
	cfg.MaxConns, cfg.MinConns = maxConns, 0
	cfg.ConnConfig.RuntimeParams[applicationNameKey] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: open %s pool: %w", name, err)
	}
	s.pools.add(pool) // its tracer is s's: a fault anywhere resets both
	return &Store{pool: pool, queries: db.New(pool), pools: s.pools}, nil
}

// Close closes every connection; it waits for connections in use to be
// released.
func (s *Store) Close() {
	s.pool.Close()
	if s.reads != nil {
		s.reads.Close()
	}
}

// Pool returns the underlying pool, for code that needs pgx directly
// (COPY, LISTEN). Queries and WithTx cover everything else.
func (s *Store) Pool() *pgxpool.Pool {
	return s.pool
}

// Queries returns the typed queries bound to the pool: each call runs in its
// own implicit transaction. Inside WithTx use db.New(tx) instead.
func (s *Store) Queries() *db.Queries {
	return s.queries
}

// WithTx runs fn in one READ WRITE transaction at READ COMMITTED, or, when
// readOnly is set, on a read-only connection where each statement is its
// own read-only transaction (reads.go: no BEGIN, no COMMIT). The
// transaction commits when fn returns nil and rolls back when fn returns an
// error or panics (the panic continues after the rollback). The error of fn
// is returned unchanged. Its BEGIN is sent together with the first
// statement (see lazyTx).
func (s *Store) WithTx(ctx context.Context, readOnly bool, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if readOnly && s.reads != nil {
		return withRead(ctx, s.reads, fn)
	}
	return withLazyTx(ctx, s.pool, readOnly, fn)
}

// Ping asks the database for its time and measures the round trip.
func (s *Store) Ping(ctx context.Context) (dbTime time.Time, latency time.Duration, err error) {
	start := time.Now()
	dbTime, err = s.queries.DatabaseNow(ctx)
	latency = time.Since(start)
	if err != nil {
		return time.Time{}, latency, fmt.Errorf("store: ping: %w", err)
	}
	return dbTime.UTC(), latency, nil
}
