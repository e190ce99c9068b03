package sandboxes_test

// Sandboxes end to end: computed (every role, the gateway included) and a
// compute-agent with the qemu runtime, as real processes; every sandbox
// and every warm instance is a real VM (TCG here) whose guest agent
// answers. One fleet is shared by the subtests, in order: booting costs
// seconds.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
	"computeplane/internal/testenv"
)

const tenant = fleettest.Tenant

type world struct {
	*fleettest.Fleet
	t     *testing.T
	agent *fleettest.Agent
	pool  string
}

func setup(t *testing.T) *world { return setupWith(t) }

// setupWith is setup with more flags for the agent.
func setupWith(t *testing.T, agentArgs ...string) *world {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))))
	w := &world{Fleet: f, t: t}
	w.pool = f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	w.agent = f.Join(w.pool, append([]string{"--runtime", "qemu", "--accel", "tcg", "--vcpu", "16", "--memory-mib", "8192", "--disk-gib", "100000"}, agentArgs...)...)
	return w
}

func (w *world) template(name string, warm int64, volumes []client.VolumeMount) client.SandboxTemplate {
	w.t.Helper()
	in := &client.SandboxTemplatesCreateInput{TenantId: tenant, Name: name, PoolId: w.pool, Flavor: "small", ImageId: "computeplane/minimal",
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Env:     client.NewOptSandboxTemplatesCreateInputEnv(client.SandboxTemplatesCreateInputEnv{"GREETING": "hello-" + name}),
		Warm:    client.NewOptWarm(client.Warm{Min: warm}), Volumes: volumes}
	res, err := w.C.SandboxTemplatesCreate(w.t.Context(), in)
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) create(key string, in client.SandboxesCreateInput) (client.Sandbox, error) {
	in.TenantId, in.IdempotencyKey = tenant, key
	if !in.Wait.Set {
		in.Wait = client.NewOptWait(client.Wait{TimeoutMs: 30000})
	}
	res, err := w.C.SandboxesCreate(w.t.Context(), &in)
	if err != nil {
		return client.Sandbox{}, err
	}
	return res.Data, nil
}

func (w *world) running(key string, in client.SandboxesCreateInput) client.Sandbox {
	w.t.Helper()
	s, err := w.create(key, in)
	require.NoError(w.t, err)
	require.Equal(w.t, "running", string(s.State), "error %v; agent:\n%s", s.Error, proctest.Tail(w.agent.Proc.Stderr.String(), 30))
	return s
}

func (w *world) get(id string) client.Sandbox {
	w.t.Helper()
	res, err := w.C.SandboxesGet(w.t.Context(), &client.SandboxesGetInput{TenantId: tenant, SandboxId: id})
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) exec(id string, argv ...string) client.ExecResult {
	w.t.Helper()
	res, err := w.C.SandboxesExec(w.t.Context(), &client.SandboxesExecInput{TenantId: tenant, SandboxId: id, Argv: argv})
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) sh(id, script string) string {
	w.t.Helper()
	r := w.exec(id, "/bin/sh", "-c", script)
	require.Zero(w.t, r.ExitCode, "%s: stderr %s", script, r.Stderr)
	return strings.TrimSpace(r.Stdout)
}

func (w *world) write(id, path, content string) {
	w.t.Helper()
	_, err := w.C.SandboxesWriteFile(w.t.Context(), &client.SandboxesWriteFileInput{TenantId: tenant, SandboxId: id, Path: path,
		ContentBase64: []byte(content)})
	require.NoError(w.t, err)
}

// post calls route with body as JSON outside the client, which only sends
// valid input; it returns the status and the answer's body.
func (w *world) post(route string, body any) (int, []byte) {
	w.t.Helper()
	b, err := json.Marshal(body)
	require.NoError(w.t, err)
	req, err := http.NewRequestWithContext(w.t.Context(), http.MethodPost, w.PublicURL+config.DefaultBasePath+route, bytes.NewReader(b))
	require.NoError(w.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Service", "1")
	req.Header.Set("Authorization", "Bearer "+w.Key)
	res, err := http.DefaultClient.Do(req)
	require.NoError(w.t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(w.t, err)
	return res.StatusCode, out
}

func (w *world) read(id, path string) string {
	w.t.Helper()
	res, err := w.C.SandboxesReadFile(w.t.Context(), &client.SandboxesReadFileInput{TenantId: tenant, SandboxId: id, Path: path})
	require.NoError(w.t, err)
	return string(res.Data.ContentBase64)
}

// readyWarm counts a template's warm instances that are ready to be
// claimed (paused, their guest checked).
func (w *world) readyWarm(template string) (n int) {
	require.NoError(w.t, w.DB.QueryRow(w.t.Context(), `select count(*) from instances where kind = 'warm' and template_id = $1
		and state = 'paused' and reported_identity = identity_generation and desired_state = 'paused'`, template).Scan(&n))
	return n
}

// dump logs the VMs as the database has them, and the daemon's log.
func (w *world) dump() {
	rows, err := w.DB.Query(w.t.Context(), `select instance_id, kind, state, desired_state, identity_generation, reported_identity, coalesce(error, '') from instances order by created_at`)
	require.NoError(w.t, err)
	defer rows.Close()
	for rows.Next() {
		var id, kind, state, desired, e string
		var gen, rep int64
		require.NoError(w.t, rows.Scan(&id, &kind, &state, &desired, &gen, &rep, &e))
		w.t.Logf("%s %s %s (desired %s) identity %d/%d %s", id, kind, state, desired, rep, gen, e)
	}
	w.t.Logf("agent:\n%s\ncomputed:\n%s", proctest.Tail(w.agent.Proc.Stderr.String(), 30), proctest.Tail(w.Computed.Stderr.String(), 30))
}

func (w *world) pause(id string) client.Sandbox {
	w.t.Helper()
	res, err := w.C.SandboxesPause(w.t.Context(), &client.SandboxesPauseInput{TenantId: tenant, SandboxId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(w.t, err)
	return res.Data
}

func (w *world) resume(id string) client.Sandbox {
	w.t.Helper()
	res, err := w.C.SandboxesResume(w.t.Context(), &client.SandboxesResumeInput{TenantId: tenant, SandboxId: id, Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(w.t, err)
	return res.Data
}

func TestSandboxesOnRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setup(t)
	tmpl := w.template("web", 2, nil)
	if !assert.Eventually(t, func() bool { return w.readyWarm(tmpl.TemplateId) == 2 }, 90*time.Second, 100*time.Millisecond) {
		w.dump()
		t.FailNow()
	}
	// The template shows them ready, besides its min and max.
	shown, err := w.C.SandboxTemplatesGet(t.Context(), &client.SandboxTemplatesGetInput{TenantId: tenant, TemplateId: tmpl.TemplateId})
	require.NoError(t, err)
	assert.EqualValues(t, 2, shown.Data.WarmReady)
	listed, err := w.C.SandboxTemplatesList(t.Context(), &client.SandboxTemplatesListInput{TenantId: tenant})
	require.NoError(t, err)
	require.Len(t, listed.Data.Items, 1)
	assert.EqualValues(t, 2, listed.Data.Items[0].WarmReady)

	var first, second, restored client.Sandbox
	t.Run("warm claims get their own identity", func(t *testing.T) {
		first = w.running("a", client.SandboxesCreateInput{TemplateId: client.NewOptString(tmpl.TemplateId),
			Env: client.NewOptSandboxesCreateInputEnv(client.SandboxesCreateInputEnv{"WHO": "first"})})
		second = w.running("b", client.SandboxesCreateInput{TemplateId: client.NewOptString(tmpl.TemplateId)})
		assert.Equal(t, "warm", string(first.Timings.How))
		assert.Equal(t, "warm", string(second.Timings.How))
		assert.NotEqual(t, first.Hostname, second.Hostname)
		assert.Equal(t, first.Hostname, w.sh(first.SandboxId, "hostname"))
		assert.Equal(t, second.Hostname, w.sh(second.SandboxId, "hostname"))
		assert.NotEqual(t, w.sh(first.SandboxId, "cat /etc/machine-id"), w.sh(second.SandboxId, "cat /etc/machine-id"))
		assert.Equal(t, "hello-web first", w.sh(first.SandboxId, `echo "$GREETING $WHO"`), "the template's env and the create's")
		assert.Equal(t, "hello-web", w.sh(second.SandboxId, `echo "$GREETING$WHO"`), "no env of another claim")
		require.False(t, first.Timings.ReadyMs.Null)
		require.False(t, first.Timings.HostReadyMs.Null)
		t.Logf("warm claim: ready in %d ms (host %d ms, placed in %d ms)", first.Timings.ReadyMs.Value, first.Timings.HostReadyMs.Value, first.Timings.PlacedMs)
		// The reconciler refills the pool.
		require.Eventually(t, func() bool { return w.readyWarm(tmpl.TemplateId) == 2 }, 90*time.Second, 100*time.Millisecond)
		assert.Equal(t, 1, w.Events("sandbox.running", first.SandboxId))
	})

	t.Run("exec and files", func(t *testing.T) {
		r := w.exec(first.SandboxId, "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
		assert.EqualValues(t, 3, r.ExitCode)
		assert.Equal(t, "out\n", r.Stdout)
		assert.Equal(t, "err\n", r.Stderr)
		w.write(first.SandboxId, "/root/notes/a.txt", "kept across pause and snapshot")
		assert.Equal(t, "kept across pause and snapshot", w.read(first.SandboxId, "/root/notes/a.txt"))
		_, err := w.C.SandboxesReadFile(t.Context(), &client.SandboxesReadFileInput{TenantId: tenant, SandboxId: first.SandboxId, Path: "/no/such"})
		assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)

		// contentBase64 is format byte: bytes in the client, base64 on the wire.
		binary := make([]byte, 256)
		for i := range binary {
			binary[i] = byte(i)
		}
		w.write(first.SandboxId, "/root/notes/bin", string(binary))
		assert.Equal(t, string(binary), w.read(first.SandboxId, "/root/notes/bin"))
		w.write(first.SandboxId, "/root/notes/empty", "")
		res, err := w.C.SandboxesReadFile(t.Context(), &client.SandboxesReadFileInput{TenantId: tenant, SandboxId: first.SandboxId, Path: "/root/notes/empty"})
		require.NoError(t, err)
		assert.NotNil(t, res.Data.ContentBase64, "an empty file is \"\", not null")
		assert.Empty(t, res.Data.ContentBase64)

		// Text that is not base64 is INVALID_INPUT naming the field, and the
		// file is left as it was.
		for _, bad := range []string{"not base64!", "aGk", "-_8="} {
			status, body := w.post("/sandboxes/writeFile", map[string]any{"tenantId": tenant, "sandboxId": first.SandboxId,
				"path": "/root/notes/a.txt", "contentBase64": bad})
			assert.Equal(t, 400, status, "%q: %s", bad, body)
			var e struct {
				Error struct {
					Code    string
					Message string
					Details struct {
						Issues []struct{ Path, Message string }
					}
				}
			}
			require.NoError(t, json.Unmarshal(body, &e), "%s", body)
			assert.Equal(t, "INVALID_INPUT", e.Error.Code, "%q", bad)
			assert.True(t, strings.HasPrefix(e.Error.Message, "contentBase64: must be base64"), "%q: %s", bad, e.Error.Message)
			if assert.Len(t, e.Error.Details.Issues, 1, "%q", bad) {
				assert.Equal(t, "contentBase64", e.Error.Details.Issues[0].Path)
			}
		}
		assert.Equal(t, "kept across pause and snapshot", w.read(first.SandboxId, "/root/notes/a.txt"), "a refused write changes nothing")
	})

	t.Run("pause and resume twice", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			assert.Equal(t, "paused", string(w.pause(first.SandboxId).State))
			_, err := w.C.SandboxesExec(t.Context(), &client.SandboxesExecInput{TenantId: tenant, SandboxId: first.SandboxId, Argv: []string{"true"}})
			assert.Equal(t, "INVALID_STATE", testenv.APIError(t, err).Code, "a paused sandbox runs nothing")
			assert.Equal(t, "running", string(w.resume(first.SandboxId).State))
			assert.Equal(t, "kept across pause and snapshot", w.read(first.SandboxId, "/root/notes/a.txt"))
		}
		assert.Equal(t, 2, w.Events("sandbox.paused", first.SandboxId))
	})

	var snap client.SandboxSnapshot
	t.Run("snapshot and restore", func(t *testing.T) {
		res, err := w.C.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: first.SandboxId,
			Keep: client.NewOptBool(true), IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
		require.NoError(t, err)
		snap = res.Data
		require.Equal(t, "ready", string(snap.State), "error %v", snap.Error)
		assert.Positive(t, snap.SizeBytes.Value)
		w.write(first.SandboxId, "/root/notes/a.txt", "written after the snapshot")
		for i, key := range []string{"r1", "r2"} {
			restored = w.running(key, client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.SnapshotId)})
			assert.Equal(t, "restore", string(restored.Timings.How))
			assert.Equal(t, "kept across pause and snapshot", w.read(restored.SandboxId, "/root/notes/a.txt"), "restore %d", i+1)
			assert.Equal(t, restored.Hostname, w.sh(restored.SandboxId, "hostname"), "a restored sandbox has its own identity")
			t.Logf("restore %d: ready in %d ms (host %d ms)", i+1, restored.Timings.ReadyMs.Value, restored.Timings.HostReadyMs.Value)
			if i == 0 {
				_, err := w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: restored.SandboxId})
				require.NoError(t, err)
			}
		}
		assert.Equal(t, "written after the snapshot", w.read(first.SandboxId, "/root/notes/a.txt"), "the source goes on")
	})

	t.Run("extend, expiry and delete", func(t *testing.T) {
		_, err := w.C.SandboxesExtend(t.Context(), &client.SandboxesExtendInput{TenantId: tenant, SandboxId: second.SandboxId, TtlSeconds: 2592000})
		e := testenv.APIError(t, err)
		assert.Equal(t, "INVALID_INPUT", e.Code)
		assert.Contains(t, e.Details, "maxExpiresAt")
		ext, err := w.C.SandboxesExtend(t.Context(), &client.SandboxesExtendInput{TenantId: tenant, SandboxId: second.SandboxId, TtlSeconds: 7200})
		require.NoError(t, err)
		assert.True(t, ext.Data.ExpiresAt.After(time.Now().Add(7100*time.Second)))

		// Its TTL passes (moved, rather than waited for): the job deletes it.
		_, err = w.DB.Exec(t.Context(), `update sandboxes set expires_at = now() where sandbox_id = $1`, second.SandboxId)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return w.get(second.SandboxId).State == "deleted" }, 15*time.Second, 50*time.Millisecond)
		assert.Equal(t, 1, w.Events("sandbox.deleted", second.SandboxId))

		// An unkept snapshot goes with its sandbox; a kept one outlives it.
		w.write(restored.SandboxId, "/root/notes/b.txt", "written in a restored sandbox")
		res, err := w.C.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: restored.SandboxId,
			IdempotencyKey: "s2", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
		require.NoError(t, err)
		unkept := res.Data
		require.Equal(t, "ready", string(unkept.State))
		// A restored sandbox maps its snapshot's memory copy-on-write, so
		// its own snapshot carries its memory in the device state: that
		// restores too.
		chained := w.running("r-chained", client.SandboxesCreateInput{FromSnapshot: client.NewOptString(unkept.SnapshotId)})
		assert.Equal(t, "written in a restored sandbox", w.read(chained.SandboxId, "/root/notes/b.txt"))
		assert.Equal(t, "kept across pause and snapshot", w.read(chained.SandboxId, "/root/notes/a.txt"))
		_, err = w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: chained.SandboxId})
		require.NoError(t, err)
		for _, id := range []string{first.SandboxId, restored.SandboxId} {
			del, err := w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: id})
			require.NoError(t, err)
			assert.Equal(t, "deleted", string(del.Data.State))
		}
		got, err := w.C.SandboxSnapshotsGet(t.Context(), &client.SandboxSnapshotsGetInput{TenantId: tenant, SnapshotId: unkept.SnapshotId})
		require.NoError(t, err)
		assert.Equal(t, "deleted", string(got.Data.State))
		got, err = w.C.SandboxSnapshotsGet(t.Context(), &client.SandboxSnapshotsGetInput{TenantId: tenant, SnapshotId: snap.SnapshotId})
		require.NoError(t, err)
		assert.Equal(t, "ready", string(got.Data.State), "kept")
		// ... and still restores.
		again := w.running("r3", client.SandboxesCreateInput{FromSnapshot: client.NewOptString(snap.SnapshotId)})
		assert.Equal(t, "kept across pause and snapshot", w.read(again.SandboxId, "/root/notes/a.txt"))
		_, err = w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: again.SandboxId})
		require.NoError(t, err)

		// The quota came back: only the warm pool holds sandboxes now.
		var used int64
		require.NoError(t, w.DB.QueryRow(t.Context(), `select used from quotas where pool_id = $1 and tenant_id = $2 and resource = 'sandboxes'`, w.pool, tenant).Scan(&used))
		assert.EqualValues(t, 2, used)
	})

	t.Run("warm pool follows its template", func(t *testing.T) {
		_, err := w.C.SandboxTemplatesUpdate(t.Context(), &client.SandboxTemplatesUpdateInput{TenantId: tenant, TemplateId: tmpl.TemplateId,
			Warm: client.NewOptWarm(client.Warm{Min: 1})})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int
			_ = w.DB.QueryRow(t.Context(), `select count(*) from instances where kind = 'warm' and template_id = $1 and desired_state <> 'deleted'`, tmpl.TemplateId).Scan(&n)
			return n == 1
		}, 15*time.Second, 100*time.Millisecond, "warm.max lowered: the newest deleted")
		_, err = w.C.SandboxTemplatesDelete(t.Context(), &client.SandboxTemplatesDeleteInput{TenantId: tenant, TemplateId: tmpl.TemplateId})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int
			_ = w.DB.QueryRow(t.Context(), `select count(*) from instances where kind = 'warm' and template_id = $1 and desired_state <> 'deleted'`, tmpl.TemplateId).Scan(&n)
			return n == 0
		}, 15*time.Second, 100*time.Millisecond, "a deleted template's warm instances go")
	})
}

func TestSandboxVolumesAttachedToRealVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots real VMs")
	}
	w := setup(t)
	require.Eventually(t, func() bool {
		var reported bool
		_ = w.DB.QueryRow(t.Context(), `select volume_reported_at is not null from nodes where node_id = $1`, w.agent.Node).Scan(&reported)
		return reported
	}, 20*time.Second, 50*time.Millisecond)
	vol, err := w.C.SandboxVolumesCreate(t.Context(), &client.SandboxVolumesCreateInput{TenantId: tenant, PoolId: w.pool, Name: "data", SizeGiB: 1, IdempotencyKey: "v"})
	require.NoError(t, err)
	v := vol.Data
	rw := w.template("rw", 0, []client.VolumeMount{{VolumeId: client.NewOptString(v.VolumeId), MountPath: "/data"}})
	ro := w.template("ro", 0, []client.VolumeMount{{VolumeId: client.NewOptString(v.VolumeId), MountPath: "/data", ReadOnly: client.NewOptBool(true)}})

	writer := w.running("w1", client.SandboxesCreateInput{TemplateId: client.NewOptString(rw.TemplateId)})
	assert.Equal(t, "cold", string(writer.Timings.How))
	require.Len(t, writer.Volumes, 1)
	assert.Equal(t, v.Serial, writer.Volumes[0].Serial)
	assert.Contains(t, w.sh(writer.SandboxId, "readlink -f /dev/disk/by-id/virtio-"+v.Serial), "/dev/vd")
	w.sh(writer.SandboxId, "echo from-the-first > /data/hello && sync")
	_, err = w.C.SandboxSnapshotsCreate(t.Context(), &client.SandboxSnapshotsCreateInput{TenantId: tenant, SandboxId: writer.SandboxId, IdempotencyKey: "with-volumes"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_STATE", e.Code)
	assert.Equal(t, "volumes-attached", e.Details["reason"], "no memory snapshot of mounted volumes")

	// One read-write attachment at a time, and none read-only beside it.
	_, err = w.create("w2", client.SandboxesCreateInput{TemplateId: client.NewOptString(rw.TemplateId)})
	e = testenv.APIError(t, err)
	assert.Equal(t, "CONFLICT", e.Code)
	assert.Equal(t, "volume-in-use", e.Details["reason"])
	_, err = w.create("r0", client.SandboxesCreateInput{TemplateId: client.NewOptString(ro.TemplateId)})
	assert.Equal(t, "volume-in-use", testenv.APIError(t, err).Details["reason"])
	_, err = w.C.SandboxVolumesDelete(t.Context(), &client.SandboxVolumesDeleteInput{TenantId: tenant, VolumeId: v.VolumeId})
	assert.Equal(t, "CONFLICT", testenv.APIError(t, err).Code, "attached")

	_, err = w.C.SandboxesDelete(t.Context(), &client.SandboxesDeleteInput{TenantId: tenant, SandboxId: writer.SandboxId})
	require.NoError(t, err)
	grown, err := w.C.SandboxVolumesResize(t.Context(), &client.SandboxVolumesResizeInput{TenantId: tenant, VolumeId: v.VolumeId, SizeGiB: 2})
	if err != nil {
		var a, b, c, d, e, f int64
		var st string
		_ = w.DB.QueryRow(t.Context(), `select state, cap_vcpu, booked_vcpu, cap_memory_mib, booked_memory_mib, cap_disk_gib, booked_disk_gib from nodes where node_id=$1`, w.agent.Node).Scan(&st, &a, &b, &c, &d, &e, &f)
		t.Logf("node after the refusal: state %s, vCPU %d booked %d, MiB %d booked %d, GiB %d booked %d", st, a, b, c, d, e, f)
	}
	require.NoError(t, err)
	assert.EqualValues(t, 2, grown.Data.SizeGiB)

	// Read-only many: two readers see what the writer wrote, on a disk the
	// next boot sees grown, not formatted again.
	r1 := w.running("r1", client.SandboxesCreateInput{TemplateId: client.NewOptString(ro.TemplateId)})
	r2 := w.running("r2", client.SandboxesCreateInput{TemplateId: client.NewOptString(ro.TemplateId)})
	for _, r := range []client.Sandbox{r1, r2} {
		assert.Equal(t, "from-the-first", w.sh(r.SandboxId, "cat /data/hello"))
		assert.Equal(t, fmt.Sprint(2<<30), w.sh(r.SandboxId, "blockdev --getsize64 /dev/disk/by-id/virtio-"+v.Serial))
		assert.NotZero(t, w.exec(r.SandboxId, "/bin/sh", "-c", "echo x > /data/other").ExitCode, "mounted read-only")
	}
	_, err = w.create("w3", client.SandboxesCreateInput{TemplateId: client.NewOptString(rw.TemplateId)})
	assert.Equal(t, "volume-in-use", testenv.APIError(t, err).Details["reason"], "no writer beside readers")
}
