package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Cluster is a PostgreSQL cluster of one test's own, for fault tests that
// restart or stop the database: the shared test cluster cannot be
// restarted under the other tests. It listens on a unix socket in a
// temporary directory and is stopped when the test ends.
type Cluster struct {
	bin, dir, socket string
	t                testing.TB
}

// NewCluster creates and starts a private cluster (initdb takes a second or
// two). It skips the test when no PostgreSQL 15+ binaries are installed.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := postgresBin()
	if bin == "" {
		t.Skip("no PostgreSQL 15+ binaries under /usr/lib/postgresql")
	}
	// As root the cluster runs as postgres, which must own the directory.
	dir, err := os.MkdirTemp("", "cptest-cluster-")
	require.NoError(t, err)
	c := &Cluster{bin: bin, dir: dir, socket: filepath.Join(dir, "run"), t: t}
	t.Cleanup(func() {
		_ = c.pgCtl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	require.NoError(t, os.Mkdir(c.socket, 0o777))
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "as root the cluster runs as the postgres user")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, c.socket} {
			require.NoError(t, os.Chown(p, uid, gid))
		}
	}
	out, err := c.run(filepath.Join(bin, "initdb"), "-D", c.data(), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	require.NoError(t, err, "initdb: %s", out)
	conf := fmt.Sprintf("listen_addresses = ''\nunix_socket_directories = '%s'\nfsync = off\nmax_connections = 60\n", c.socket)
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(conf)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, c.pgCtl("start", "-w"))
	return c
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// URL is the address of the cluster's postgres database.
func (c *Cluster) URL() string {
	return "postgres://postgres@/postgres?host=" + url.QueryEscape(c.socket)
}

// Restart stops the cluster, as an operator's fast restart does (open
// sessions are terminated), waits down, then starts it again.
func (c *Cluster) Restart(down time.Duration) {
	c.t.Helper()
	require.NoError(c.t, c.pgCtl("stop", "-m", "fast", "-w"))
	time.Sleep(down)
	require.NoError(c.t, c.pgCtl("start", "-w"))
}

func (c *Cluster) pgCtl(args ...string) error {
	args = append(args, "-D", c.data(), "-l", filepath.Join(c.dir, "log"))
	out, err := c.run(filepath.Join(c.bin, "pg_ctl"), args...)
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", args[0], err, out)
	}
	return nil
}

// run runs a PostgreSQL tool, as postgres when the test runs as root.
func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = "/"
	return cmd.CombinedOutput()
}

// postgresBin is the bin directory of the newest PostgreSQL 15+ installed.
func postgresBin() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, d := range dirs {
		if major(d) >= 15 {
			if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
				return d
			}
		}
	}
	return ""
}

func major(binDir string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(filepath.Dir(binDir)), "/"))
	return n
}
