package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func open(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func TestOpenRejectsBadURLWithoutEchoingIt(t *testing.T) {
	t.Parallel()
	_, err := store.Open(t.Context(), "postgres://user:hunter2@%zz/db")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

func TestOpenFailsWhenTheDatabaseIsMissing(t *testing.T) {
	t.Parallel()
	u, err := dbtest.WithDatabase(dbtest.BaseURL(t), "cptest_does_not_exist")
	require.NoError(t, err)
	_, err = store.Open(t.Context(), u)
	require.ErrorContains(t, err, "store: connect")
}

func TestMigrateEmptyDatabase(t *testing.T) {
	t.Parallel()
	s := open(t, dbtest.EmptyURL(t))
	ctx := t.Context()

	applied, err := s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Empty(t, applied)

	require.NoError(t, s.Migrate(ctx))
	applied, err = s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Equal(t, knownMigrations(t), applied)

	installed, err := s.Queries().ExtensionInstalled(ctx, "btree_gist")
	require.NoError(t, err)
	require.True(t, installed)

	// A second run finds nothing to do.
	require.NoError(t, s.Migrate(ctx))
	again, err := s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Equal(t, applied, again)
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	url := dbtest.EmptyURL(t)
	const n = 4
	stores := make([]*store.Store, n)
	for i := range stores {
		stores[i] = open(t, url)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() { errs[i] = s.Migrate(t.Context()) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	applied, err := stores[0].AppliedMigrations(t.Context())
	require.NoError(t, err)
	require.Equal(t, knownMigrations(t), applied)
}

func TestMigrateRefusesUnknownMigrations(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	// What a newer build would have left behind.
	for _, v := range []int64{99999, 123} {
		_, err := s.Pool().Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)", v)
		require.NoError(t, err)
	}

	err := s.Migrate(ctx)
	var unknown *store.UnknownMigrationsError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, []int64{123, 99999}, unknown.Versions)
	require.ErrorContains(t, err, "00123")
	require.ErrorContains(t, err, "99999")

	applied, err := s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Equal(t, append(knownMigrations(t), 123, 99999), applied)
}

func TestAppliedMigrationsNewestRowWins(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	ctx := t.Context()
	// Older goose releases recorded a down as a new row with is_applied false.
	_, err := s.Pool().Exec(ctx, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (70007, true), (70007, false)")
	require.NoError(t, err)
	applied, err := s.AppliedMigrations(ctx)
	require.NoError(t, err)
	require.Equal(t, knownMigrations(t), applied)
	require.NoError(t, s.Migrate(ctx))
}

func TestWithTx(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	errBoom := errors.New("boom")

	insert := func(key string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO service_meta (key, value) VALUES ($1, 'v')", key)
			return err
		}
	}
	tests := []struct {
		name     string
		readOnly bool
		fn       func(key string) func(ctx context.Context, tx pgx.Tx) error
		panics   bool
		wantErr  func(t *testing.T, err error)
		wantRow  bool
	}{
		{
			name:    "commits when fn succeeds",
			fn:      insert,
			wantRow: true,
		},
		{
			name: "rolls back and returns the error of fn",
			fn: func(key string) func(ctx context.Context, tx pgx.Tx) error {
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := insert(key)(ctx, tx); err != nil {
						return err
					}
					return fmt.Errorf("wrapped: %w", errBoom)
				}
			},
			wantErr: func(t *testing.T, err error) { require.ErrorIs(t, err, errBoom) },
		},
		{
			name: "rolls back when fn panics",
			fn: func(key string) func(ctx context.Context, tx pgx.Tx) error {
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := insert(key)(ctx, tx); err != nil {
						return err
					}
					panic("boom")
				}
			},
			panics: true,
		},
		{
			name:     "read only refuses writes",
			readOnly: true,
			fn:       insert,
			wantErr: func(t *testing.T, err error) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "25006", pgErr.Code) // read_only_sql_transaction
			},
		},
		{
			name:     "read only reads",
			readOnly: true,
			fn: func(string) func(ctx context.Context, tx pgx.Tx) error {
				return func(ctx context.Context, tx pgx.Tx) error {
					var mode string
					if err := tx.QueryRow(ctx, "SHOW transaction_read_only").Scan(&mode); err != nil {
						return err
					}
					if mode != "on" {
						return fmt.Errorf("transaction_read_only = %s", mode)
					}
					return nil
				}
			},
		},
		{
			name:     "a read sends no BEGIN: each statement is its own transaction",
			readOnly: true,
			fn: func(string) func(ctx context.Context, tx pgx.Tx) error {
				return func(ctx context.Context, tx pgx.Tx) error {
					var first, third time.Time
					if err := tx.QueryRow(ctx, "SELECT transaction_timestamp()").Scan(&first); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.01)"); err != nil {
						return err
					}
					if err := tx.QueryRow(ctx, "SELECT transaction_timestamp()").Scan(&third); err != nil {
						return err
					}
					if !third.After(first) {
						return errors.New("the statements of a read ran in one transaction")
					}
					return nil
				}
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := fmt.Sprintf("k%d", i)
			run := func() error { return s.WithTx(t.Context(), tc.readOnly, tc.fn(key)) }
			if tc.panics {
				require.PanicsWithValue(t, "boom", func() { _ = run() })
			} else if err := run(); tc.wantErr != nil {
				tc.wantErr(t, err)
			} else {
				require.NoError(t, err)
			}
			var n int
			require.NoError(t, s.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta WHERE key = $1", key).Scan(&n))
			require.Equal(t, tc.wantRow, n == 1)
		})
	}
}

func TestWithTxReturnsConnectionsToThePool(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	size := int(s.Pool().Config().MaxConns)
	for range size + 2 {
		_ = s.WithTx(t.Context(), false, func(context.Context, pgx.Tx) error { return errors.New("no") })
		func() {
			defer func() { _ = recover() }()
			_ = s.WithTx(t.Context(), true, func(context.Context, pgx.Tx) error { panic("no") })
		}()
	}
	require.Zero(t, s.Pool().Stat().AcquiredConns())
}

func TestPing(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	before := time.Now()
	dbTime, latency, err := s.Ping(t.Context())
	require.NoError(t, err)
	require.Positive(t, latency)
	require.Equal(t, time.UTC, dbTime.Location())
	require.WithinDuration(t, before, dbTime, time.Minute)
}

func TestPingAfterClose(t *testing.T) {
	t.Parallel()
	s, err := store.Open(t.Context(), dbtest.URL(t))
	require.NoError(t, err)
	s.Close()
	_, _, err = s.Ping(t.Context())
	require.ErrorContains(t, err, "store: ping")
}

func TestMapNoRows(t *testing.T) {
	t.Parallel()
	other := errors.New("other")
	tests := []struct {
		name string
		in   error
		want error
	}{
		{"nil stays nil", nil, nil},
		{"no rows is not found", pgx.ErrNoRows, store.ErrNotFound},
		{"wrapped no rows is not found", fmt.Errorf("get: %w", pgx.ErrNoRows), store.ErrNotFound},
		{"other errors pass through", other, other},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := store.MapNoRows(tc.in)
			if tc.want == nil {
				require.NoError(t, got)
				return
			}
			require.ErrorIs(t, got, tc.want)
		})
	}
}

func TestMapNoRowsFromAQuery(t *testing.T) {
	t.Parallel()
	s := dbtest.NewStore(t)
	var v string
	err := s.Pool().QueryRow(t.Context(), "SELECT value FROM service_meta WHERE key = 'absent'").Scan(&v)
	require.ErrorIs(t, store.MapNoRows(err), store.ErrNotFound)
	require.False(t, strings.Contains(store.ErrNotFound.Error(), "pgx"))
}

func TestVisible(t *testing.T) {
	t.Parallel()
	type row struct{ Tenant string }
	notFound := errors.New("row r1 not found")
	other := errors.New("connection lost")
	tests := []struct {
		name    string
		row     row
		err     error
		visible bool
		want    row
		wantErr error
	}{
		{"a visible row is returned", row{"t1"}, nil, true, row{"t1"}, nil},
		{"an invisible row is not found and not returned", row{"t2"}, nil, false, row{}, notFound},
		{"no row is not found", row{}, pgx.ErrNoRows, false, row{}, notFound},
		{"a wrapped no row is not found", row{}, fmt.Errorf("get: %w", pgx.ErrNoRows), true, row{}, notFound},
		{"other errors pass, whatever visible says", row{}, other, false, row{}, other},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.Visible(tc.row, tc.err, tc.visible, notFound)
			require.Equal(t, tc.want, got)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
		})
	}
}

func knownMigrations(t *testing.T) []int64 {
	t.Helper()
	known, err := store.KnownMigrations()
	require.NoError(t, err)
	require.NotEmpty(t, known)
	return known
}

// A URL with target_session_attrs=read-write (a primary and its standby,
// to follow a failover) serves reads as well as writes: the read pool's
// sessions are read-only by design and are checked for a primary instead.
func TestReadWriteTargetSessionAttrs(t *testing.T) {
	u := dbtest.URL(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	ctx := t.Context()
	s, err := store.Open(ctx, u+sep+"target_session_attrs=read-write")
	require.NoError(t, err)
	defer s.Close()
	var n int
	require.NoError(t, s.WithTx(ctx, true, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "select 1").Scan(&n)
	}))
	require.Equal(t, 1, n)
	require.NoError(t, s.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "select 2").Scan(&n)
	}))
	require.Equal(t, 2, n)
}

// A pool's connections keep no description cache (statements run in pgx's
// caching mode, which never reads it), unless the URL asks for one; the
// statement cache stays.
func TestConnectionsHoldNoDescriptionCache(t *testing.T) {
	t.Parallel()
	url := dbtest.EmptyURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for url, want := range map[string]int{url: 0, url + sep + "description_cache_capacity=64": 64} {
		s := open(t, url)
		conn, err := s.Pool().Acquire(t.Context())
		require.NoError(t, err)
		t.Cleanup(conn.Release) // before the store's Close, which waits for it
		cfg := conn.Conn().Config()
		require.Equal(t, want, cfg.DescriptionCacheCapacity)
		require.Equal(t, 512, cfg.StatementCacheCapacity)
		for range 2 { // prepared once, then taken from the statement cache
			var n int
			require.NoError(t, conn.QueryRow(t.Context(), "select $1::int + 1", 41).Scan(&n))
			require.Equal(t, 42, n)
		}
	}
}
