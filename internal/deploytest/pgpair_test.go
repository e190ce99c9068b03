package deploytest

// A PostgreSQL primary and a streaming-replication standby made with
// pg_basebackup, from the machine's PostgreSQL binaries, on loopback
// ports of their own: the database of the deployment under test, which
// the test fails over (pg_ctl promote).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/testenv"
)

type pgPair struct {
	bin                  string // PostgreSQL's bin directory
	dir                  string
	primary, standby     string // data directories
	primaryPort, stbPort int
}

func pgBinDir(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_basebackup")); err == nil {
			return dirs[i]
		}
	}
	t.Skip("no PostgreSQL binaries under /usr/lib/postgresql")
	return ""
}

// asPostgres runs a PostgreSQL tool as the postgres user when the test is
// root (initdb and postgres refuse root).
func (p *pgPair) run(t *testing.T, tool string, args ...string) string {
	t.Helper()
	name := filepath.Join(p.bin, tool)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s: %s", tool, strings.Join(args, " "), out)
	return string(out)
}

func startPGPair(t *testing.T) *pgPair {
	t.Helper()
	p := &pgPair{bin: pgBinDir(t)}
	dir, err := os.MkdirTemp("", "deploytest-pg")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	p.dir, p.primary, p.standby = dir, filepath.Join(dir, "primary"), filepath.Join(dir, "standby")
	if os.Geteuid() == 0 {
		out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	t.Cleanup(func() {
		for _, d := range []string{p.primary, p.standby} {
			if _, err := os.Stat(filepath.Join(d, "postmaster.pid")); err == nil {
				_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(p.bin, "pg_ctl"), "-D", d, "-m", "immediate", "-w", "stop").Run()
			}
		}
		_ = os.RemoveAll(dir)
	})
	p.primaryPort, p.stbPort = testenv.FreePort(t), testenv.FreePort(t)
	p.run(t, "initdb", "-D", p.primary, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nwal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nfsync = off\nsynchronous_commit = off\nmax_connections = 200\n",
		p.primaryPort, dir)
	p.appendConf(t, p.primary, conf)
	p.run(t, "pg_ctl", "-D", p.primary, "-l", filepath.Join(dir, "primary.log"), "-w", "start")
	p.run(t, "pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(p.primaryPort), "-U", "postgres", "-D", p.standby, "-R", "-X", "stream", "--no-sync")
	p.appendConf(t, p.standby, fmt.Sprintf("\nport = %d\n", p.stbPort))
	p.run(t, "pg_ctl", "-D", p.standby, "-l", filepath.Join(dir, "standby.log"), "-w", "start")
	return p
}

func (p *pgPair) appendConf(t *testing.T, data, conf string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(conf)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// URL names both servers; pgx tries them in order and keeps the one that
// takes writes (target_session_attrs=read-write), so that a process
// reconnects to the standby once it is promoted.
func (p *pgPair) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.primaryPort, p.stbPort)
}

// PrimaryURL names the primary alone.
func (p *pgPair) PrimaryURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.primaryPort)
}

// FailPrimary stops the primary at once, as a crash would.
func (p *pgPair) FailPrimary(t *testing.T) {
	t.Helper()
	p.run(t, "pg_ctl", "-D", p.primary, "-m", "immediate", "-w", "stop")
}

// Promote makes the standby the primary and waits until it takes writes.
func (p *pgPair) Promote(t *testing.T) {
	t.Helper()
	p.run(t, "pg_ctl", "-D", p.standby, "-w", "promote")
}

// WaitReplicated waits until the standby streams from the primary.
func (p *pgPair) WaitReplicated(t *testing.T, q func(string) (string, error)) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := q("select count(*) from pg_stat_replication where state = 'streaming'")
		return err == nil && s == "1"
	}, 30*time.Second, 100*time.Millisecond, "the standby streams")
}
