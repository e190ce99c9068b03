package dbtest_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fatalTB records Fatal instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

type fatalled struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(fatalled{})
}

func TestBaseURLUnsetFails(t *testing.T) {
	t.Setenv(dbtest.EnvURL, "")
	tb := &fatalTB{TB: t}
	require.PanicsWithValue(t, fatalled{}, func() { dbtest.BaseURL(tb) })
	require.Equal(t, "SERVICE_DATABASE_URL is unset: run make test", tb.msg)
}

func TestURLGivesSeparateMigratedDatabases(t *testing.T) {
	t.Parallel()
	a, b := dbtest.NewStore(t), dbtest.NewStore(t)
	for _, s := range []*store.Store{a, b} {
		applied, err := s.AppliedMigrations(t.Context())
		require.NoError(t, err)
		require.NotEmpty(t, applied)
	}
	_, err := a.Pool().Exec(t.Context(), "INSERT INTO service_meta (key, value) VALUES ('k', 'a')")
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool().QueryRow(t.Context(), "SELECT count(*) FROM service_meta").Scan(&n))
	require.Zero(t, n)
}

func TestEmptyURLHasNoMigrations(t *testing.T) {
	t.Parallel()
	s, err := store.Open(t.Context(), dbtest.EmptyURL(t))
	require.NoError(t, err)
	defer s.Close()
	applied, err := s.AppliedMigrations(t.Context())
	require.NoError(t, err)
	require.Empty(t, applied)
}

func TestDatabaseIsDroppedWhenTheTestEnds(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		u, err := url.Parse(dbtest.URL(t))
		require.NoError(t, err)
		name = u.Path[1:]
	})
	require.NotEmpty(t, name)
	conn, err := pgx.Connect(t.Context(), dbtest.BaseURL(t))
	require.NoError(t, err)
	defer func() { _ = conn.Close(t.Context()) }()
	var exists bool
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	require.False(t, exists)
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, base, want string
	}{
		{
			name: "url with a socket host",
			base: "postgres://postgres@/postgres?host=/x/run&port=5432&sslmode=disable",
			want: "postgres://postgres@/db1?host=/x/run&port=5432&sslmode=disable",
		},
		{
			name: "url with a tcp host and no path",
			base: "postgresql://u:p@localhost:5432",
			want: "postgresql://u:p@localhost:5432/db1",
		},
		{
			name: "url naming the database in the query",
			base: "postgres://u@h/other?dbname=other",
			want: "postgres://u@h/db1?dbname=db1",
		},
		{
			name: "key=value form",
			base: "host=/x/run port=5432 dbname=postgres",
			want: "host=/x/run port=5432 dbname=postgres dbname=db1",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := dbtest.WithDatabase(tc.base, "db1")
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
