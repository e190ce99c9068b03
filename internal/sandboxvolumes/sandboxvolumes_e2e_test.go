package sandboxvolumes_test

// sandboxVolumes end to end: computed and a compute-agent as real
// processes; the volume files are real sparse files in the agent's volume
// store, reported with statfs.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/fleettest"
	"computeplane/internal/testenv"
)

const tenant = fleettest.Tenant

func TestVolumesOnTheirHost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	f := fleettest.Start(t, "")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "recording", "--disk-gib", "1000000")
	// The host reports its volume store before it takes a volume.
	require.Eventually(t, func() bool {
		var reported bool
		_ = f.DB.QueryRow(t.Context(), `select volume_reported_at is not null from nodes where node_id = $1`, agent.Node).Scan(&reported)
		return reported
	}, 20*time.Second, 50*time.Millisecond)

	create := func(name, key string, size int64) (client.SandboxVolume, error) {
		res, err := f.C.SandboxVolumesCreate(t.Context(), &client.SandboxVolumesCreateInput{TenantId: tenant, PoolId: pool, Name: name,
			SizeGiB: size, IdempotencyKey: key})
		if err != nil {
			return client.SandboxVolume{}, err
		}
		return res.Data, nil
	}
	fileSize := func(serial string) int64 {
		info, err := os.Stat(filepath.Join(agent.Dir, "volumes", serial+".raw"))
		if err != nil {
			return -1
		}
		return info.Size()
	}
	diskQuota := func() (used int64) {
		require.NoError(t, f.DB.QueryRow(t.Context(), `select coalesce(sum(used), 0) from quotas where pool_id = $1 and resource = 'diskGiB'`, pool).Scan(&used))
		return used
	}

	v, err := create("data", "k1", 2)
	require.NoError(t, err)
	assert.Equal(t, "ready", string(v.State))
	assert.Equal(t, agent.Node, v.NodeId)
	assert.LessOrEqual(t, len(v.Serial), 20)
	require.Eventually(t, func() bool { return fileSize(v.Serial) == 2<<30 }, 10*time.Second, 20*time.Millisecond, "the host made the sparse file")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(filepath.Join(agent.Dir, "volumes", v.Serial+".raw"), &st))
	assert.Less(t, st.Blocks*512, int64(1<<20), "sparse: nothing written")
	assert.EqualValues(t, 2, diskQuota())

	// Idempotent by key; the same key with another size, or the same name
	// under another key, is CONFLICT.
	again, err := create("data", "k1", 2)
	require.NoError(t, err)
	assert.Equal(t, v.VolumeId, again.VolumeId)
	_, err = create("data", "k1", 3)
	assert.Equal(t, "CONFLICT", testenv.APIError(t, err).Code)
	_, err = create("data", "k2", 1)
	assert.Equal(t, "CONFLICT", testenv.APIError(t, err).Code)

	// More than the host's volume store holds: CAPACITY_UNAVAILABLE,
	// reason volume-storage with freeGiB; nothing left behind.
	_, err = create("huge", "k3", 16384)
	e := testenv.APIError(t, err)
	require.Equal(t, "CAPACITY_UNAVAILABLE", e.Code, e.Message)
	var count int
	require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) from sandbox_volumes`).Scan(&count))
	assert.Equal(t, 1, count)

	// Grow: the host grows the file as soon as the spec says so; shrinking
	// is INVALID_INPUT, the same size unchanged.
	grown, err := f.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: v.VolumeId, SizeGiB: 5})
	require.NoError(t, err)
	assert.EqualValues(t, 5, grown.Data.SizeGiB)
	require.Eventually(t, func() bool { return fileSize(v.Serial) == 5<<30 }, 10*time.Second, 20*time.Millisecond)
	assert.EqualValues(t, 5, diskQuota())
	_, err = f.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: v.VolumeId, SizeGiB: 4})
	assert.Equal(t, "INVALID_INPUT", testenv.APIError(t, err).Code)
	same, err := f.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: v.VolumeId, SizeGiB: 5})
	require.NoError(t, err)
	assert.Equal(t, grown.Data.UpdatedAt, same.Data.UpdatedAt)

	// Two resizes at once: one is decided, the other is CONFLICT
	// resize-in-flight or sees the grown size.
	var wg sync.WaitGroup
	codes := make([]string, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: v.VolumeId, SizeGiB: 6})
			if err != nil {
				codes[i] = testenv.APIError(t, err).Code
			}
		}()
	}
	wg.Wait()
	for _, c := range codes {
		assert.Contains(t, []string{"", "CONFLICT"}, c)
	}
	assert.EqualValues(t, 6, diskQuota(), "charged once")

	// delete: deleting, then deleted once the host removed the file; the
	// booking and the quota come back.
	del, err := f.C.SandboxVolumesDelete(t.Context(), &client.SandboxVolumesDeleteInput{TenantId: tenant, VolumeId: v.VolumeId})
	require.NoError(t, err)
	assert.Equal(t, "deleting", string(del.Data.State))
	require.Eventually(t, func() bool {
		g, err := f.C.SandboxVolumesGet(t.Context(), &client.SandboxVolumesGetInput{TenantId: tenant, VolumeId: v.VolumeId})
		return err == nil && g.Data.State == "deleted"
	}, 15*time.Second, 50*time.Millisecond)
	assert.Equal(t, int64(-1), fileSize(v.Serial))
	assert.Zero(t, diskQuota())
	for _, typ := range []string{"sandbox.volume.created", "sandbox.volume.resized", "sandbox.volume.deleting", "sandbox.volume.deleted"} {
		assert.GreaterOrEqual(t, f.Events(typ, v.VolumeId), 1, typ)
	}
	// The name is free again.
	_, err = create("data", "k4", 1)
	require.NoError(t, err, fmt.Sprint("a deleted volume's name is free"))
}

// A transaction holding a volume's row (a delete, the host's status report
// finishing one, a sandbox attaching it) is no resize in flight: a resize
// waits for it and the state it leaves decides. Only another resize is
// CONFLICT resize-in-flight. Before the fix, every resize that met a held
// row answered resize-in-flight, so one on a deleting volume sometimes did.
func TestResizeMeetsAHeldRow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs computed and compute-agent")
	}
	f := fleettest.Start(t, "")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "recording", "--disk-gib", "1000000")
	require.Eventually(t, func() bool {
		var reported bool
		_ = f.DB.QueryRow(t.Context(), `select volume_reported_at is not null from nodes where node_id = $1`, agent.Node).Scan(&reported)
		return reported
	}, 20*time.Second, 50*time.Millisecond)
	v, err := f.C.SandboxVolumesCreate(t.Context(), &client.SandboxVolumesCreateInput{TenantId: tenant, PoolId: pool, Name: "data",
		SizeGiB: 1, IdempotencyKey: "k1"})
	require.NoError(t, err)
	id := v.Data.VolumeId

	// hold locks the volume's row in a transaction of the test's, as the
	// writers other than resize do; the returned func commits it.
	hold := func() func() {
		tx, err := f.DB.Begin(t.Context())
		require.NoError(t, err)
		// A failed test still gives the connection back (the pool's
		// Close waits for it); after a commit this does nothing.
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(t.Context(), `select 1 from sandbox_volumes where volume_id = $1 for update`, id)
		require.NoError(t, err)
		return func() { require.NoError(t, tx.Commit(t.Context())) }
	}
	// resize starts a resize and returns its answer's code ("" for done).
	resize := func(size int64) <-chan string {
		out := make(chan string, 1)
		go func() {
			_, err := f.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: id, SizeGiB: size})
			code := ""
			if err != nil {
				e := testenv.APIError(t, err)
				code = e.Code + " " + fmt.Sprint(e.Details["reason"])
			}
			out <- code
		}()
		return out
	}
	// waiting is whether the service's locking read of a volume waits for
	// the row (no delete runs meanwhile, so it is the resize's).
	waiting := func() bool {
		var n int
		require.NoError(t, f.DB.QueryRow(t.Context(), `select count(*) from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock' and query like '%GetSandboxVolumeForUpdate %'`).Scan(&n))
		return n > 0
	}
	// blocked waits until the resize whose answer is res waits for the
	// row, failing if it answers first.
	blocked := func(res <-chan string) {
		deadline := time.Now().Add(15 * time.Second)
		for !waiting() {
			select {
			case code := <-res:
				require.Failf(t, "the resize answered instead of waiting for the held row", "answer %q", code)
			default:
			}
			require.True(t, time.Now().Before(deadline), "the resize never waited for the row")
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A ready volume whose row is held: the resize waits; a second resize
	// meanwhile is CONFLICT resize-in-flight; the first grows the volume.
	commit := hold()
	first := resize(2)
	blocked(first)
	assert.Equal(t, "CONFLICT resize-in-flight", <-resize(3))
	commit()
	assert.Equal(t, "", <-first)
	got, err := f.C.SandboxVolumesGet(t.Context(), &client.SandboxVolumesGetInput{TenantId: tenant, VolumeId: id})
	require.NoError(t, err)
	assert.EqualValues(t, 2, got.Data.SizeGiB)

	// A deleting volume whose row is held (the host's status report
	// finishing the delete): INVALID_STATE, never resize-in-flight.
	_, err = f.C.SandboxVolumesDelete(t.Context(), &client.SandboxVolumesDeleteInput{TenantId: tenant, VolumeId: id})
	require.NoError(t, err)
	commit = hold()
	res := resize(5)
	blocked(res)
	commit()
	assert.Equal(t, "INVALID_STATE <nil>", <-res)
	got, err = f.C.SandboxVolumesGet(t.Context(), &client.SandboxVolumesGetInput{TenantId: tenant, VolumeId: id})
	require.NoError(t, err)
	assert.EqualValues(t, 2, got.Data.SizeGiB, "unchanged")
}
