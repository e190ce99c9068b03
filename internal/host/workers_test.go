package host_test

// Worker roles and the notifier in Host.Serve (interface specification,
// "Host startup and shutdown"): a process with a worker role registers in
// the workers table and runs its jobs; on shutdown, after the listener
// closed, it releases its leases and leaves the table. A committed
// mutation wakes the outbox topic in the process and, with the postgres
// notifier, in the others.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/host"
	"computeplane/internal/logging"
	"computeplane/internal/notify"
	"computeplane/internal/testenv"
	"computeplane/internal/workers"
)

func TestServeRunsWorkersAndWakesAfterCommit(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	cfgFile := testenv.ConfigFile(t, "notifier: {kind: postgres}\nworkers: {id: host-test-worker}\n")
	port := testenv.FreePort(t)
	env := map[string]string{
		"SERVICE_DATABASE_URL": url,
		"SERVICE_SECRET":       testenv.TestSecret,
		"SERVICE_CONFIG":       cfgFile,
		"HOST":                 "127.0.0.1",
		"PORT":                 strconv.Itoa(port),
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	h, err := host.New(t.Context(), cfg, logging.New(io.Discard, slog.LevelDebug), host.Options{})
	require.NoError(t, err)
	token, _, err := h.Identity().EnsureRootAdminKey(t.Context())
	require.NoError(t, err)

	require.NotNil(t, h.Workers(), "the default roles include the worker roles")
	assert.Equal(t, "host-test-worker", h.Workers().ID())
	var once sync.Once
	jobStarted := make(chan workers.Lease, 1)
	h.Workers().RegisterSingleton("probe", func(ctx context.Context, l workers.Lease) error {
		once.Do(func() { jobStarted <- l })
		<-ctx.Done()
		return nil
	})
	woken, cancelSub := h.Notifier().Subscribe(notify.TopicOutbox)
	defer cancelSub()
	require.True(t, h.Notifier().CrossProcess())

	// Another process's view: a LISTEN on the notifier's channel.
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(t.Context(), "LISTEN "+notify.Channel)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, nil) }()
	defer func() {
		cancel()
		<-done
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	(&served{addr: addr}).waitReady(t)

	select {
	case l := <-jobStarted:
		assert.Equal(t, workers.Lease{Name: "job/probe", Holder: "host-test-worker", Epoch: 1}, l)
	case <-time.After(10 * time.Second):
		t.Fatal("the singleton job did not start")
	}
	var rows int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM workers WHERE id = 'host-test-worker'").Scan(&rows))
	assert.Equal(t, 1, rows, "registered in the workers table")

	// A mutation commits: the outbox topic is woken here and NOTIFYed.
	body, _ := json.Marshal(map[string]string{"tenantId": cfg.RootTenantID, "name": "db-password", "value": "s3cret", "idempotencyKey": "k1"})
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+cfg.BasePath+"/secrets/put", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Service", "1")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	out, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	select {
	case <-woken:
	case <-time.After(time.Second):
		t.Fatal("the outbox topic was not woken in the process")
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer wcancel()
	nt, err := conn.WaitForNotification(wctx)
	require.NoError(t, err, "NOTIFY reaches other processes")
	assert.Equal(t, notify.TopicOutbox, nt.Payload)

	// Shutdown: the workers release their leases and leave the table.
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
		done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM workers").Scan(&rows))
	assert.Zero(t, rows, "left the workers table")
	var live []string
	lrows, err := conn.Query(t.Context(), "SELECT name FROM leases WHERE expires_at > now()")
	require.NoError(t, err)
	for lrows.Next() {
		var n string
		require.NoError(t, lrows.Scan(&n))
		live = append(live, n)
	}
	require.NoError(t, lrows.Err())
	assert.Empty(t, live, "every lease released")
}

func TestAPIRoleAloneRunsNoWorker(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	env := map[string]string{"SERVICE_DATABASE_URL": "postgres://unused", "SERVICE_SECRET": testenv.TestSecret, "SERVICE_ROLES": "api"}
	cfg, err := config.Load(func(k string) string { return env[k] })
	require.NoError(t, err)
	h, err := host.Assemble(cfg, st, logging.New(io.Discard, slog.LevelDebug), builtin.All(), host.Overrides{})
	require.NoError(t, err)
	assert.Nil(t, h.Workers())
	assert.False(t, h.Notifier().CrossProcess(), "no notifier configured: in-process wakes only")
	for _, roles := range []string{"controllers", "scheduler", "sinks", "iam", "api,sinks"} {
		env["SERVICE_ROLES"] = roles
		cfg, err := config.Load(func(k string) string { return env[k] })
		require.NoError(t, err)
		h, err := host.Assemble(cfg, st, logging.New(io.Discard, slog.LevelDebug), builtin.All(), host.Overrides{})
		require.NoError(t, err)
		assert.NotNil(t, h.Workers(), fmt.Sprint(roles))
	}
}
