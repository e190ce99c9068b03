// Package dbtest gives each test its own PostgreSQL database on the cluster
// named by SERVICE_DATABASE_URL (make test starts one and sets it).
//
// URL and NewStore copy a template database that holds the migrated schema,
// so a test pays for CREATE DATABASE, not for the migrations. The template
// is named after a hash of the embedded migrations and shared by every test
// process: the first process to need it builds it under an advisory lock,
// the others wait for that lock and reuse it. Each test database is dropped
// when its test ends.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/store"
	"computeplane/migrations"
)

// EnvURL is the variable naming the cluster the tests use.
const EnvURL = "SERVICE_DATABASE_URL"

const (
	// templateLockID serializes building templates across processes. Advisory
	// locks are per database; this one is taken in the URL's own database.
	templateLockID int64 = 0x636f6d7074657374 // "comptest"

	// Names: test databases carry their creation time so that a later run
	// can drop the ones a killed process left behind.
	namePrefix     = "cptest_"
	templatePrefix = "cptest_tmpl_"
	leftoverAge    = 6 * time.Hour
	// Templates record their creation time in their comment.
	templateComment = "dbtest template built at "
	setupTimeout    = 2 * time.Minute
)

var testDBName = regexp.MustCompile(`^cptest_(\d+)_[0-9a-f]+$`)

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// BaseURL returns SERVICE_DATABASE_URL, failing the test when it is unset.
func BaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		t.Fatal("SERVICE_DATABASE_URL is unset: run make test")
	}
	return u
}

// URL creates a fresh database holding the migrated schema and returns its
// URL. The database is dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	base := BaseURL(t)
	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(base) })
	if templateErr != nil {
		t.Fatalf("dbtest: template database: %v", templateErr)
	}
	return create(t, base, templateName)
}

// EmptyURL creates a fresh database without any migration applied and
// returns its URL, for tests of migrating itself. It is dropped when the
// test ends.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, BaseURL(t), "template0")
}

// NewStore opens a Store on a fresh migrated database (see URL) and closes
// it when the test ends, before the database is dropped.
func NewStore(t testing.TB) *store.Store {
	t.Helper()
	u := URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	s, err := store.Open(ctx, u)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func create(t testing.TB, base, template string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	name := namePrefix + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomHex(6)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{template}.Sanitize())); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := dropDatabase(ctx, base, name); err != nil {
			t.Errorf("dbtest: %v", err)
		}
	})
	u, err := WithDatabase(base, name)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return u
}

// WithDatabase returns the connection string base pointed at database name.
// It accepts the URL form (postgres://...) and the key=value form.
func WithDatabase(base, name string) (string, error) {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", fmt.Errorf("invalid %s", EnvURL)
		}
		u.Path = "/" + name
		u.RawPath = ""
		q := u.Query()
		if q.Has("dbname") {
			q.Set("dbname", name)
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// In the key=value form a later key wins.
	return base + " dbname=" + name, nil
}

func dropDatabase(ctx context.Context, base, name string) error {
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	// FORCE ends sessions a test left open (PostgreSQL 13+).
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)",
		pgx.Identifier{name}.Sanitize())); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// ensureTemplate makes sure the template database for the embedded
// migrations exists and returns its name.
func ensureTemplate(base string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	sum, err := migrationsHash(migrations.FS)
	if err != nil {
		return "", err
	}
	name := templatePrefix + sum
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	// Closing the session releases the lock.
	defer func() { _ = admin.Close(context.Background()) }()
	if err := db.New(admin).AdvisoryLock(ctx, templateLockID); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	dropLeftovers(ctx, admin, name)

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if exists {
		return name, nil
	}

	// Build under another name and rename at the end, so that a process
	// killed half-way never leaves a template that looks complete.
	building := name + "_build"
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{building}.Sanitize())); err != nil {
		return "", fmt.Errorf("drop stale build: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE template0", pgx.Identifier{building}.Sanitize())); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	u, err := WithDatabase(base, building)
	if err != nil {
		return "", err
	}
	s, err := store.Open(ctx, u)
	if err != nil {
		return "", err
	}
	err = s.Migrate(ctx)
	s.Close()
	if err != nil {
		return "", err
	}
	// No connections to a template: CREATE DATABASE refuses to copy a
	// database that has sessions.
	stmts := []string{
		fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize()),
		fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS false", pgx.Identifier{name}.Sanitize()),
		fmt.Sprintf("COMMENT ON DATABASE %s IS '%s%d'", pgx.Identifier{name}.Sanitize(), templateComment, time.Now().Unix()),
	}
	for _, stmt := range stmts {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return "", fmt.Errorf("finish template: %w", err)
		}
	}
	return name, nil
}

// dropLeftovers drops test databases older than leftoverAge (their test
// process was killed before its cleanup ran) and templates of other
// migration sets built longer ago than that. Failures are ignored: this is
// housekeeping.
func dropLeftovers(ctx context.Context, admin *pgx.Conn, current string) {
	rows, err := admin.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE datname LIKE 'cptest\_%'`)
	if err != nil {
		return
	}
	type dbRow struct{ Name, Comment string }
	dbs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dbRow])
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-leftoverAge).Unix()
	for _, d := range dbs {
		var created string
		if m := testDBName.FindStringSubmatch(d.Name); m != nil {
			created = m[1]
		} else if strings.HasPrefix(d.Name, templatePrefix) && d.Name != current {
			created = strings.TrimPrefix(d.Comment, templateComment)
		} else {
			continue
		}
		at, err := strconv.ParseInt(created, 10, 64)
		if err != nil || at > cutoff {
			continue
		}
		_, _ = admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{d.Name}.Sanitize()))
	}
}

// migrationsHash names the template after the migration files' names and
// contents, so a changed migration gets a new template.
func migrationsHash(fsys fs.FS) (string, error) {
	var paths []string
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read migrations: %w", err)
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return "", fmt.Errorf("read migrations: %w", err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
