package instances_test

// Instances end to end: computed (every role, the gateway included) and a
// compute-agent with the qemu runtime, as real processes; every instance
// is a real VM (TCG on these machines) whose guest agent answers.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/pki"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

type world struct {
	t        *testing.T
	c        *computeclient.Client
	db       *pgxpool.Pool
	agentBin string
	agentDir string
	agent    *proctest.Process
	poolID   string
	node     string
}

func (w *world) runAgent() {
	w.agent = proctest.Start(w.t, "agent", w.agentBin, proctest.ChildEnv(nil), "run", "--dir", w.agentDir,
		"--runtime", "qemu", "--accel", "tcg", "--vcpu", "4", "--memory-mib", "4096", "--disk-gib", "20")
}

func setup(t *testing.T) *world {
	im := qemutest.Image(t)
	dbURL := dbtest.URL(t)
	dir := t.TempDir()
	computed := proctest.Build(t, "computeplane/cmd/computed")
	w := &world{t: t, agentBin: proctest.Build(t, "computeplane/cmd/compute-agent")}
	pkiFile := filepath.Join(dir, "pki.json")
	_, _, err := pki.Init(pkiFile, testenv.TestSecret, "vm.local")
	require.NoError(t, err)
	port, gwPort := testenv.FreePort(t), testenv.FreePort(t)
	cfg := testenv.ConfigFile(t, fmt.Sprintf("gateway: {url: \"https://127.0.0.1:%d\", region: eu, listen: \"127.0.0.1:%d\", downAfterMs: 5000}\nimages: {dir: %q}\n",
		gwPort, gwPort, filepath.Dir(filepath.Dir(im.Location))))
	env := proctest.ChildEnv(map[string]string{
		"SERVICE_DATABASE_URL": dbURL, "SERVICE_SECRET": testenv.TestSecret, "SERVICE_PKI": pkiFile, "SERVICE_CONFIG": cfg,
		"SERVICE_BASE_URL": fmt.Sprintf("http://127.0.0.1:%d", port), "HOST": "127.0.0.1", "PORT": strconv.Itoa(port),
	})
	p := proctest.Start(t, "computed", computed, env, "serve")
	p.WaitHealthy(t, fmt.Sprintf("127.0.0.1:%d", port))
	key := proctest.CreateKey(t, computed, env, "acme", "ops", "owner")
	w.c, err = computeclient.New(fmt.Sprintf("http://127.0.0.1:%d%s", port, config.DefaultBasePath),
		computeclient.WithToken(key), computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	require.NoError(t, err)
	w.db, err = pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(w.db.Close)

	site, err := w.c.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := w.c.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "vms",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	w.poolID = pool.Data.PoolId
	_, err = w.c.FlavorsCreate(t.Context(), &client.FlavorsCreateInput{TenantId: "acme", PoolId: w.poolID, Name: "small", Vcpu: 1, MemoryMiB: 256,
		DiskGiB: client.NewOptInt64(1)})
	require.NoError(t, err)
	tok, err := w.c.PoolsJoinToken(t.Context(), &client.PoolsJoinTokenInput{TenantId: "acme", PoolId: w.poolID})
	require.NoError(t, err)
	w.agentDir, err = os.MkdirTemp("", "agent") // short: unix socket paths under it
	require.NoError(t, err)
	t.Cleanup(func() {
		// The VMs outlive the daemon by design: end them with the test.
		pids, _ := filepath.Glob(filepath.Join(w.agentDir, "runtime", "vms", "*", "qemu.pid"))
		for _, f := range pids {
			if b, err := os.ReadFile(f); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		_ = os.RemoveAll(w.agentDir)
	})
	tokFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokFile, []byte(tok.Data.Token), 0o600))
	w.node = strings.TrimSpace(proctest.Run(t, w.agentBin, proctest.ChildEnv(nil), "join", "--api", fmt.Sprintf("http://127.0.0.1:%d", port),
		"--token-file", tokFile, "--dir", w.agentDir))
	w.runAgent()
	require.Eventually(t, func() bool {
		w.agent.RequireRunning(t)
		n, err := w.c.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: w.node})
		return err == nil && n.Data.State == "ready"
	}, 30*time.Second, 50*time.Millisecond)
	return w
}

func (w *world) get(id string) client.Instance {
	w.t.Helper()
	res, err := w.c.InstancesGet(w.t.Context(), &client.InstancesGetInput{TenantId: "acme", InstanceId: id})
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) vmFile(id, name string) string {
	return filepath.Join(w.agentDir, "runtime", "vms", id, name)
}

func (w *world) vmPid(id string) int {
	b, err := os.ReadFile(w.vmFile(id, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func (w *world) events(typ, id string) int {
	var n int
	require.NoError(w.t, w.db.QueryRow(w.t.Context(), `select count(*) from outbox where type = $1 and subject = $2`, typ, id).Scan(&n))
	return n
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil && !zombie(pid) }

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	rp := strings.LastIndexByte(s, ')')
	return rp > 0 && len(s) > rp+2 && s[rp+2] == 'Z'
}

func TestInstanceLifecycleOnRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setup(t)
	marker := make([]byte, 8)
	_, _ = rand.Read(marker)
	mark := "user-data-ran-" + hex.EncodeToString(marker)

	// create with wait: a running instance whose guest agent answered.
	start := time.Now()
	res, err := w.c.InstancesCreate(t.Context(), &client.InstancesCreateInput{TenantId: "acme", PoolId: w.poolID, Flavor: "small",
		ImageId: "computeplane/minimal", Name: "web-1", IdempotencyKey: "i1",
		UserData: client.NewOptString("#!/bin/sh\necho " + mark + " > /dev/console\n"),
		Wait:     client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	inst := res.Data
	require.Equal(t, "running", string(inst.State), "%+v", inst)
	t.Logf("instances.create to running (wait) in %s", time.Since(start).Round(time.Millisecond))
	assert.False(t, inst.ReadyAt.Null, "readyAt is set")
	assert.True(t, inst.HasUserData)
	assert.Equal(t, w.node, inst.NodeId.Value)
	id := inst.InstanceId
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(w.vmFile(id, "console.log"))
		return strings.Contains(string(b), mark)
	}, 10*time.Second, 50*time.Millisecond, "the user data ran inside the guest")
	var booked int
	require.NoError(t, w.db.QueryRow(t.Context(), `select booked_vcpu from nodes where node_id = $1`, w.node).Scan(&booked))
	assert.Equal(t, 1, booked)

	// stop, start, reboot.
	stopped, err := w.c.InstancesStop(t.Context(), &client.InstancesStopInput{TenantId: "acme", InstanceId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	assert.Equal(t, "stopped", string(stopped.Data.State))
	assert.False(t, alive(w.vmPid(id)), "the VM ended")
	started, err := w.c.InstancesStart(t.Context(), &client.InstancesStartInput{TenantId: "acme", InstanceId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	assert.Equal(t, "running", string(started.Data.State))
	rb, err := w.c.InstancesReboot(t.Context(), &client.InstancesRebootInput{TenantId: "acme", InstanceId: id})
	require.NoError(t, err)
	assert.EqualValues(t, 1, rb.Data.Reboots)
	require.Eventually(t, func() bool { return w.get(id).State == "running" }, 30*time.Second, 100*time.Millisecond)

	// The daemon killed and restarted: the VM runs on and is still tracked.
	pid := w.vmPid(id)
	require.True(t, alive(pid))
	w.agent.Kill(t)
	assert.True(t, alive(pid), "the VM outlives its daemon")
	w.runAgent()
	require.Eventually(t, func() bool {
		var gw *string
		_ = w.db.QueryRow(t.Context(), `select session_gateway from nodes where node_id = $1`, w.node).Scan(&gw)
		return gw != nil
	}, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, pid, w.vmPid(id))
	assert.Equal(t, "running", string(w.get(id).State))

	// A VM killed from outside is noticed and reported.
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return w.get(id).State == "failed" }, 20*time.Second, 100*time.Millisecond)
	assert.Contains(t, w.get(id).Error.Value, "without being asked")
	assert.Equal(t, 1, w.events("instance.failed", id))

	// delete: the VM's files go, capacity and quota come back.
	del, err := w.c.InstancesDelete(t.Context(), &client.InstancesDeleteInput{TenantId: "acme", InstanceId: id})
	require.NoError(t, err)
	assert.Equal(t, "deleted", string(del.Data.DesiredState))
	require.Eventually(t, func() bool { return w.get(id).State == "deleted" }, 20*time.Second, 100*time.Millisecond)
	assert.NoDirExists(t, filepath.Dir(w.vmFile(id, "x")))
	require.NoError(t, w.db.QueryRow(t.Context(), `select booked_vcpu from nodes where node_id = $1`, w.node).Scan(&booked))
	assert.Zero(t, booked)
	for _, typ := range []string{"instance.created", "instance.running", "instance.stopped", "instance.deleted"} {
		assert.GreaterOrEqual(t, w.events(typ, id), 1, typ)
	}
}
