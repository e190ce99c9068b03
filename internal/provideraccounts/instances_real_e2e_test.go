package provideraccounts_test

// Instances of a provider pool, for real: computed with every role as a
// process and the localqemu provider; instances.create launches a qemu
// VM through the provider (the smallest offer that holds the flavor),
// with the tenant's image and user data whose secret reference is
// resolved only when the provider is called; delete releases it.

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/providers/localqemu"
	"computeplane/internal/testenv"
)

func TestProviderInstancesOnRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and runs computed")
	}
	f, im, provDir := localFleet(t, "")
	ctx := t.Context()
	acct, err := f.C.ProviderAccountsCreate(ctx, &client.ProviderAccountsCreateInput{TenantId: fleettest.Tenant, Provider: localqemu.Name, Name: "lab",
		Config: raw(map[string]any{"image": im.ID, "accel": "tcg", "machineTypes": []any{
			map[string]any{"name": "large", "vcpu": 2, "memoryMiB": 512},
			map[string]any{"name": "small", "vcpu": 1, "memoryMiB": 256},
			map[string]any{"name": "tiny", "vcpu": 1, "memoryMiB": 128},
		}})})
	require.NoError(t, err)
	account := acct.Data.AccountId
	site, err := f.C.SitesCreate(ctx, &client.SitesCreateInput{TenantId: fleettest.Tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "cloud"})
	require.NoError(t, err)
	pool, err := f.C.PoolsCreate(ctx, &client.PoolsCreateInput{TenantId: fleettest.Tenant, SiteId: site.Data.SiteId, Name: "cloud",
		Class: client.PoolsCreateInputClassVpsHost, Hosting: client.NewOptPoolsCreateInputHosting(client.PoolsCreateInputHostingProvider),
		AccountId: client.NewOptString(account), IdempotencyKey: "cloud"})
	require.NoError(t, err)
	poolID := pool.Data.PoolId
	_, err = f.C.FlavorsCreate(ctx, &client.FlavorsCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Name: "web", Vcpu: 1, MemoryMiB: 200,
		DiskGiB: client.NewOptInt64(1)})
	require.NoError(t, err)
	quota := func(resource string) int64 {
		var used int64
		require.NoError(t, f.DB.QueryRow(ctx, `select used from quotas where tenant_id = $1 and pool_id = $2 and resource = $3`,
			fleettest.Tenant, poolID, resource).Scan(&used))
		return used
	}

	// Refusals leave nothing behind.
	_, err = f.C.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Flavor: "web",
		ImageId: im.ID, Name: "bad", IdempotencyKey: "bad", ReservationId: client.NewOptString("rsv_0123456789abcdefghjkmnpqrs")})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "reservations hold hosted capacity")
	_, err = f.C.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Flavor: "web",
		ImageId: im.ID, Name: "bad", IdempotencyKey: "bad2", UserData: client.NewOptString("echo secret://tenants/acme/nope")})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code, "a reference to a secret that does not exist")
	_, err = f.C.FlavorsCreate(ctx, &client.FlavorsCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Name: "gpu", Vcpu: 1, MemoryMiB: 200,
		Gpus: client.NewOptGPUs(client.GPUs{Count: 1, Model: "L4"})})
	require.NoError(t, err)
	_, err = f.C.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Flavor: "gpu",
		ImageId: im.ID, Name: "bad", IdempotencyKey: "bad3"})
	assert.Equal(t, "UNSUPPORTED", testenv.APIError(t, err).Code, "machines are launched without GPUs")
	assert.Zero(t, quota("instances"))

	secretValue := "pv-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err = f.C.SecretsPut(ctx, &client.SecretsPutInput{TenantId: fleettest.Tenant, Name: "api-key", Value: secretValue, IdempotencyKey: "sec"})
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(secretValue))
	userData := "#!/bin/sh\necho provider-user-data-ran > /dev/console\nprintf %s 'secret://tenants/acme/api-key' | sha256sum > /dev/console\n"

	start := time.Now()
	res, err := f.C.InstancesCreate(ctx, &client.InstancesCreateInput{TenantId: fleettest.Tenant, PoolId: poolID, Flavor: "web",
		ImageId: im.ID, Name: "web-1", IdempotencyKey: "i1", UserData: client.NewOptString(userData),
		Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	inst := res.Data
	id := inst.InstanceId
	if inst.State != "running" { // TCG on a loaded machine: the launch may outlast one wait
		require.Eventually(t, func() bool {
			g, err := f.C.InstancesGet(ctx, &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: id})
			require.NoError(t, err)
			inst = g.Data
			require.NotEqual(t, "failed", string(inst.State), "%v\n%s", inst.Error, proctest.Tail(f.Computed.Stderr.String(), 30))
			return inst.State == "running"
		}, 2*time.Minute, 100*time.Millisecond)
	}
	t.Logf("instances.create to running on a provider machine in %s", time.Since(start).Round(time.Millisecond))
	assert.True(t, inst.NodeId.Null, "no node: a provider's machine")
	machine := inst.MachineId.Value
	require.True(t, strings.HasPrefix(machine, "lq_"), "machineId %q", machine)
	assert.False(t, inst.ReadyAt.Null)
	var offer string
	require.NoError(t, f.DB.QueryRow(ctx, `select provider_offer from instances where instance_id = $1`, id).Scan(&offer))
	assert.Equal(t, "small", offer, "the smallest offer that holds 1 vCPU and 200 MiB")
	assert.EqualValues(t, 1, quota("instances"))
	assert.EqualValues(t, 1, quota("vcpu"))
	assert.EqualValues(t, 200, quota("memoryMiB"))

	// The machine runs the image, named for the instance, and ran the user
	// data with the secret's value, which nothing of the service keeps.
	mdir := filepath.Join(provDir, localqemu.Name, machine)
	console := func() string { b, _ := os.ReadFile(filepath.Join(mdir, "vm", "console.log")); return string(b) }
	require.Eventually(t, func() bool {
		return strings.Contains(console(), "provider-user-data-ran") && strings.Contains(console(), hex.EncodeToString(sum[:]))
	}, 10*time.Second, 50*time.Millisecond, "the user data ran with the secret's value: %s", proctest.Tail(console(), 10))
	var rows int
	require.NoError(t, f.DB.QueryRow(ctx, `select count(*) from instances where user_data like '%' || $1 || '%'`, secretValue).Scan(&rows))
	assert.Zero(t, rows)
	assert.NotContains(t, f.Computed.Stderr.String(), secretValue)
	assert.Equal(t, 1, f.Events("instance.running", id))

	// Only launch and release: stop, start and reboot are UNSUPPORTED.
	_, err = f.C.InstancesStop(ctx, &client.InstancesStopInput{TenantId: fleettest.Tenant, InstanceId: id})
	assert.Equal(t, "UNSUPPORTED", testenv.APIError(t, err).Code)
	_, err = f.C.InstancesReboot(ctx, &client.InstancesRebootInput{TenantId: fleettest.Tenant, InstanceId: id})
	assert.Equal(t, "UNSUPPORTED", testenv.APIError(t, err).Code)
	_, err = f.C.InstancesStart(ctx, &client.InstancesStartInput{TenantId: fleettest.Tenant, InstanceId: id})
	assert.Equal(t, "UNSUPPORTED", testenv.APIError(t, err).Code)

	// The account cannot go while the instance lives.
	_, err = f.C.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: fleettest.Tenant, AccountId: account})
	assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code)

	// A machine that dies at the provider fails its instance.
	pidOf := func() int {
		b, _ := os.ReadFile(filepath.Join(mdir, "vm", "qemu.pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}
	pid := pidOf()
	require.Positive(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		g, err := f.C.InstancesGet(ctx, &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: id})
		require.NoError(t, err)
		inst = g.Data
		return inst.State == "failed"
	}, 30*time.Second, 100*time.Millisecond)
	assert.Contains(t, inst.Error.Value, machine)
	assert.Equal(t, 1, f.Events("instance.failed", id))

	// Delete: the machine is released, quota comes back.
	_, err = f.C.InstancesDelete(ctx, &client.InstancesDeleteInput{TenantId: fleettest.Tenant, InstanceId: id})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		g, err := f.C.InstancesGet(ctx, &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: id})
		require.NoError(t, err)
		return g.Data.State == "deleted"
	}, 30*time.Second, 100*time.Millisecond)
	assert.NoDirExists(t, mdir, "the machine released")
	assert.Zero(t, quota("instances"))
	assert.Zero(t, quota("vcpu"))
	_, err = f.C.ProviderAccountsDelete(ctx, &client.ProviderAccountsDeleteInput{TenantId: fleettest.Tenant, AccountId: account})
	assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code, "its pool still holds the account (not archived)")
}
