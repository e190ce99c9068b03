package store

import (
	"context"
	"io/fs"
	"slices"

	"github.com/pressly/goose/v3"

	"computeplane/migrations"
)

// KnownMigrations lists the versions of the migrations embedded in this
// build, ascending.
func KnownMigrations() ([]int64, error) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, len(names))
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

// MigrationStatus reports the applied migrations and those this build knows,
// for the self check.
func (s *Store) MigrationStatus(ctx context.Context) (applied, known []int64, err error) {
	if applied, err = s.AppliedMigrations(ctx); err != nil {
		return nil, nil, err
	}
	known, err = KnownMigrations()
	return applied, known, err
}
