package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"computeplane/gen/db"
	"computeplane/migrations"
)

// migrateLockID names the advisory lock that serializes the whole of
// Migrate (the check for unknown migrations and goose's run) across
// processes. goose takes its own lock (lock.DefaultLockID) inside; this one
// closes the gap between our check and goose's lock, in which a newer build
// could otherwise migrate. Advisory locks are per database.
const migrateLockID int64 = 0x636f6d7075746531 // "compute1"

// UnknownMigrationsError reports migrations applied to the database that
// this build does not have: a newer build migrated it. Running an older
// build against that schema is refused (interface specification, Versioning).
type UnknownMigrationsError struct {
	Versions []int64 // ascending
}

func (e *UnknownMigrationsError) Error() string {
	names := make([]string, len(e.Versions))
	for i, v := range e.Versions {
		names[i] = fmt.Sprintf("%05d (migrations/%05d_*.sql)", v, v)
	}
	return fmt.Sprintf("store: the database holds migrations this build does not know: %s; "+
		"a newer build migrated it, run that build or a newer one", strings.Join(names, ", "))
}

// Migrate applies the embedded migrations (package migrations) that the
// database lacks. Before applying anything it refuses, with an
// *UnknownMigrationsError, a database that holds an applied migration this
// build does not know. Concurrent calls from several processes are safe:
// one migrates, the others wait and then find nothing to do.
func (s *Store) Migrate(ctx context.Context) error {
	return s.migrate(ctx, migrations.FS)
}

func (s *Store) migrate(ctx context.Context, fsys fs.FS) error {
	// A dedicated connection holds the session lock: closing it releases
	// the lock whatever happens, and no pooled connection is left holding it.
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("store: migrate: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if err := db.New(conn).AdvisoryLock(ctx, migrateLockID); err != nil {
		return fmt.Errorf("store: migrate: lock: %w", err)
	}

	sqlDB := stdlib.OpenDBFromPool(s.pool)
	defer func() { _ = sqlDB.Close() }()

	provider, err := newProvider(sqlDB, fsys)
	if err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, sqlDB)
	if err != nil {
		return err
	}
	if unknown := unknownVersions(applied, provider.ListSources()); len(unknown) > 0 {
		return &UnknownMigrationsError{Versions: unknown}
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	return nil
}

// AppliedMigrations returns the versions of the migrations applied to the
// database, ascending; none when it was never migrated.
func (s *Store) AppliedMigrations(ctx context.Context) ([]int64, error) {
	sqlDB := stdlib.OpenDBFromPool(s.pool)
	defer func() { _ = sqlDB.Close() }()
	return appliedVersions(ctx, sqlDB)
}

func newProvider(sqlDB *sql.DB, fsys fs.FS) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(
		// Our own lock is already held, so goose's is normally free at
		// once; poll every second rather than goose's default five.
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	return provider, nil
}

// appliedVersions reads goose's version table through goose's own store.
// The newest row of a version decides whether it is applied (the provider
// deletes rows on down; older goose releases inserted is_applied = false).
func appliedVersions(ctx context.Context, sqlDB *sql.DB) ([]int64, error) {
	gstore, err := database.NewStore(database.DialectPostgres, goose.DefaultTablename)
	if err != nil {
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	if ext, ok := gstore.(database.StoreExtender); ok {
		exists, err := ext.TableExists(ctx, sqlDB)
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			return nil, fmt.Errorf("store: migrations: %w", err)
		}
		if err == nil && !exists {
			return []int64{}, nil
		}
	}
	rows, err := gstore.ListMigrations(ctx, sqlDB) // newest first
	if err != nil {
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	seen := make(map[int64]bool, len(rows))
	out := []int64{}
	for _, r := range rows {
		if seen[r.Version] {
			continue
		}
		seen[r.Version] = true
		if r.IsApplied && r.Version > 0 { // version 0 marks the table's creation
			out = append(out, r.Version)
		}
	}
	slices.Sort(out)
	return out, nil
}

// unknownVersions lists the applied versions (ascending) that no source has.
func unknownVersions(applied []int64, sources []*goose.Source) []int64 {
	known := make(map[int64]bool, len(sources))
	for _, src := range sources {
		known[src.Version] = true
	}
	var unknown []int64
	for _, v := range applied {
		if !known[v] {
			unknown = append(unknown, v)
		}
	}
	return unknown
}
