package sandboxtemplates_test

// sandboxTemplates through the client against a real PostgreSQL: the
// create rules 1 to 9 and the update rules of the specification.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
	"computeplane/internal/testenv"
)

type world struct {
	env    *testenv.Env
	owner  *computeclient.Client
	member *computeclient.Client
	pool   string
	other  string // a second pool of the tenant
}

func writeImage(t *testing.T, dir, id, format string) {
	t.Helper()
	m := map[string]any{"id": id, "format": format, "sizeBytes": 1, "sha256": fmt.Sprintf("%064x", 1), "location": "/images/" + id}
	if format == "kernel+initrd" {
		m["initrd"] = "/images/" + id + ".initrd"
	}
	b, _ := json.Marshal(m)
	require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(id)+".json"), b, 0o600))
}

func setup(t *testing.T) *world {
	t.Helper()
	imgs := t.TempDir()
	writeImage(t, imgs, "minimal", "kernel+initrd")
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, fmt.Sprintf("images: {dir: %q}\n", imgs))))
	w := &world{env: env, owner: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner"))),
		member: env.Client(t, computeclient.WithToken(env.Key(t, "acme", "mo", "member")))}
	site, err := w.owner.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu", IdempotencyKey: "s"})
	require.NoError(t, err)
	for i, p := range []*string{&w.pool, &w.other} {
		pool, err := w.owner.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: fmt.Sprintf("p%d", i),
			Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: fmt.Sprintf("p%d", i)})
		require.NoError(t, err)
		*p = pool.Data.PoolId
		for _, f := range []client.FlavorsCreateInput{{Name: "small", Vcpu: 1, MemoryMiB: 256},
			{Name: "gpu", Vcpu: 4, MemoryMiB: 4096, Gpus: client.NewOptGPUs(client.GPUs{Model: "L4", Count: 1})}} {
			f.TenantId, f.PoolId = "acme", *p
			_, err := w.owner.FlavorsCreate(t.Context(), &f)
			require.NoError(t, err)
		}
		// A host whose volume store reported room.
		n, err := nodes.Register(t.Context(), env.Store, env.Host.Identity().Projection(), env.Config.TypePrefix,
			nodes.Registration{PoolID: *p, Hostname: fmt.Sprintf("h%d", i), VCPU: 8, MemoryMiB: 8192, DiskGiB: 1000})
		require.NoError(t, err)
		_, err = env.Store.Pool().Exec(t.Context(), `update nodes set volume_available_bytes = 1099511627776, volume_reserved_bytes = 0,
			volume_outstanding_bytes = 0, volume_reported_at = now() where node_id = $1`, n.NodeID)
		require.NoError(t, err)
	}
	return w
}

func (w *world) volume(t *testing.T, c *computeclient.Client, pool, name string) string {
	t.Helper()
	v, err := c.SandboxVolumesCreate(t.Context(), &client.SandboxVolumesCreateInput{TenantId: "acme", PoolId: pool, Name: name, SizeGiB: 1, IdempotencyKey: name})
	require.NoError(t, err)
	return v.Data.VolumeId
}

func base(w *world, name string) *client.SandboxTemplatesCreateInput {
	return &client.SandboxTemplatesCreateInput{TenantId: "acme", Name: name, PoolId: w.pool, Flavor: "small", ImageId: "minimal"}
}

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

func TestCreateRules(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()
	ok, err := w.owner.SandboxTemplatesCreate(ctx, base(w, "ok"))
	require.NoError(t, err)
	tp := ok.Data
	assert.Equal(t, "qemu", tp.Runtime)
	assert.EqualValues(t, 3600, tp.DefaultTtlSeconds)
	assert.EqualValues(t, 86400, tp.MaxTtlSeconds)
	assert.Equal(t, "egress", string(tp.Network))
	assert.EqualValues(t, 1, tp.Version)
	assert.Zero(t, tp.WarmReady, "no warm instance is ready yet")

	_, err = w.owner.SecretsPut(ctx, &client.SecretsPutInput{TenantId: "acme", Name: "db", Value: "s3cret", IdempotencyKey: "sec"})
	require.NoError(t, err)
	secretRef := "secret://tenants/acme/db"

	for name, c := range map[string]struct {
		mutate func(in *client.SandboxTemplatesCreateInput)
		code   string
		in     string // a word of the message
	}{
		"rule 1: a pool not the tenant's": {func(in *client.SandboxTemplatesCreateInput) { in.PoolId = "pool_0000000000000000000000000z" }, "NOT_FOUND", "pool"},
		"rule 2: a missing flavor":        {func(in *client.SandboxTemplatesCreateInput) { in.Flavor = "large" }, "NOT_FOUND", "flavor"},
		"rule 2: a missing image":         {func(in *client.SandboxTemplatesCreateInput) { in.ImageId = "nope" }, "NOT_FOUND", "image"},
		"rule 3: another runtime":         {func(in *client.SandboxTemplatesCreateInput) { in.Runtime = client.NewOptString("firecracker") }, "INVALID_INPUT", "runtime"},
		"rule 3: GPUs not passed through": {func(in *client.SandboxTemplatesCreateInput) { in.Flavor = "gpu" }, "INVALID_INPUT", "GPUs"},
		"rule 4: default TTL above max": {func(in *client.SandboxTemplatesCreateInput) {
			in.DefaultTtlSeconds = client.NewOptInt64(7200)
			in.MaxTtlSeconds = client.NewOptInt64(3600)
		}, "INVALID_INPUT", "defaultTtlSeconds"},
		"rule 4: warm.max below min": {func(in *client.SandboxTemplatesCreateInput) {
			in.Warm = client.NewOptWarm(client.Warm{Min: 3, Max: client.NewOptInt64(1)})
		}, "INVALID_INPUT", "warm"},
		"rule 5: a URI that is not a secret": {func(in *client.SandboxTemplatesCreateInput) {
			in.UserData = client.NewOptNilString("#!/bin/sh\ncurl https://example.com/x")
		}, "INVALID_INPUT", "userData"},
		"rule 5: another tenant's secret": {func(in *client.SandboxTemplatesCreateInput) {
			in.UserData = client.NewOptNilString("token=secret://tenants/globex/db")
		}, "INVALID_INPUT", "userData"},
		"rule 5: a secret that does not exist": {func(in *client.SandboxTemplatesCreateInput) {
			in.UserData = client.NewOptNilString("token=secret://tenants/acme/nope")
		}, "INVALID_INPUT", "does not exist"},
		"rule 9: a live template's name": {func(in *client.SandboxTemplatesCreateInput) { in.Name = "ok" }, "CONFLICT", "name"},
	} {
		in := base(w, "t-"+fmt.Sprint(len(name)))
		c.mutate(in)
		_, err := w.owner.SandboxTemplatesCreate(ctx, in)
		e := testenv.APIError(t, err)
		assert.Equal(t, c.code, e.Code, name)
		assert.Contains(t, e.Message, c.in, name)
	}
	withSecret := base(w, "with-secret")
	withSecret.UserData = client.NewOptNilString("#!/bin/sh\nexport TOKEN=" + secretRef)
	_, err = w.owner.SandboxTemplatesCreate(ctx, withSecret)
	require.NoError(t, err, "a reference to a secret of the tenant")

	// rule 6: volumes.
	data := w.volume(t, w.owner, w.pool, "data")
	elsewhere := w.volume(t, w.owner, w.other, "elsewhere")
	mountAt := func(id, p string, ro bool) client.VolumeMount {
		return client.VolumeMount{VolumeId: client.NewOptString(id), MountPath: p, ReadOnly: client.NewOptBool(ro)}
	}
	for name, c := range map[string]struct {
		vols []client.VolumeMount
		warm int64
		code string
	}{
		"missing":           {[]client.VolumeMount{mountAt("vol_0000000000000000000000000z", "/data", false)}, 0, "NOT_FOUND"},
		"in another pool":   {[]client.VolumeMount{mountAt(elsewhere, "/data", false)}, 0, "INVALID_INPUT"},
		"named twice":       {[]client.VolumeMount{mountAt(data, "/a", true), mountAt(data, "/b", true)}, 0, "INVALID_INPUT"},
		"over /etc":         {[]client.VolumeMount{mountAt(data, "/etc/app", false)}, 0, "INVALID_INPUT"},
		"with a .. segment": {[]client.VolumeMount{mountAt(data, "/srv/../data", false)}, 0, "INVALID_INPUT"},
		"with a warm pool":  {[]client.VolumeMount{mountAt(data, "/data", false)}, 1, "INVALID_INPUT"},
	} {
		in := base(w, "v-"+fmt.Sprint(len(name)))
		in.Volumes = c.vols
		if c.warm > 0 {
			in.Warm = client.NewOptWarm(client.Warm{Min: c.warm})
		}
		_, err := w.owner.SandboxTemplatesCreate(ctx, in)
		assert.Equal(t, c.code, code(t, err), name)
	}
	nested := w.volume(t, w.owner, w.pool, "nested")
	in := base(w, "nested")
	in.Volumes = []client.VolumeMount{mountAt(data, "/srv", true), mountAt(nested, "/srv/inner", true)}
	_, err = w.owner.SandboxTemplatesCreate(ctx, in)
	assert.Equal(t, "INVALID_INPUT", code(t, err), "a mount inside another")

	// rule 7: decided on the caller's own credential: a member may mount
	// another's volume read-only, not read-write.
	in = base(w, "member-rw")
	in.Volumes = []client.VolumeMount{mountAt(data, "/data", false)}
	_, err = w.member.SandboxTemplatesCreate(ctx, in)
	assert.Equal(t, "ACCESS_DENIED", code(t, err))
	in.Name = "member-ro"
	in.Volumes = []client.VolumeMount{mountAt(data, "/data", true)}
	_, err = w.member.SandboxTemplatesCreate(ctx, in)
	require.NoError(t, err)

	// No refused create left a template behind.
	list, err := w.owner.SandboxTemplatesList(ctx, &client.SandboxTemplatesListInput{TenantId: "acme"})
	require.NoError(t, err)
	var names []string
	for _, x := range list.Data.Items {
		names = append(names, x.Name)
	}
	assert.Equal(t, []string{"member-ro", "ok", "with-secret"}, names)

	// A volume a live template mounts cannot be deleted.
	_, err = w.owner.SandboxVolumesDelete(ctx, &client.SandboxVolumesDeleteInput{TenantId: "acme", VolumeId: data})
	assert.Equal(t, "CONFLICT", code(t, err))
}

func TestUpdateAndDelete(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := t.Context()
	data := w.volume(t, w.owner, w.pool, "data")
	in := base(w, "app")
	in.Volumes = []client.VolumeMount{{Name: client.NewOptString("data"), MountPath: "/data"}}
	created, err := w.owner.SandboxTemplatesCreate(ctx, in)
	require.NoError(t, err)
	id := created.Data.TemplateId

	up, err := w.owner.SandboxTemplatesUpdate(ctx, &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: id,
		MaxTtlSeconds: client.NewOptInt64(7200), UserData: client.NewOptNilString("echo hi")})
	require.NoError(t, err)
	assert.EqualValues(t, 2, up.Data.Version)
	assert.EqualValues(t, 7200, up.Data.MaxTtlSeconds)
	assert.Equal(t, "echo hi", up.Data.UserData.Value)
	assert.Equal(t, "app", up.Data.Name, "the name stays")
	_, err = w.owner.SandboxTemplatesUpdate(ctx, &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: id, DefaultTtlSeconds: client.NewOptInt64(9000)})
	assert.Equal(t, "INVALID_INPUT", code(t, err), "a default TTL above the maximum after the change")
	cleared, err := w.owner.SandboxTemplatesUpdate(ctx, &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: id, UserData: client.OptNilString{Set: true, Null: true}})
	require.NoError(t, err)
	assert.True(t, cleared.Data.UserData.Null, "null removes it")

	// The name "data" now names another volume: an update that decides
	// the volumes again is CONFLICT volumes-changed.
	_, err = w.env.Store.Pool().Exec(ctx, `update sandbox_volumes set state = 'deleted' where volume_id = $1`, data)
	require.NoError(t, err)
	w.volume(t, w.owner, w.pool, "data-2")
	_, err = w.env.Store.Pool().Exec(ctx, `update sandbox_volumes set name = 'data' where name = 'data-2'`)
	require.NoError(t, err)
	_, err = w.owner.SandboxTemplatesUpdate(ctx, &client.SandboxTemplatesUpdateInput{TenantId: "acme", TemplateId: id, Network: client.NewOptSandboxTemplatesUpdateInputNetwork(client.SandboxTemplatesUpdateInputNetworkNone)})
	e := testenv.APIError(t, err)
	assert.Equal(t, "CONFLICT", e.Code)
	assert.Equal(t, "volumes-changed", e.Details["reason"])

	del, err := w.owner.SandboxTemplatesDelete(ctx, &client.SandboxTemplatesDeleteInput{TenantId: "acme", TemplateId: id})
	require.NoError(t, err)
	assert.True(t, del.Data.Deleted)
	_, err = w.owner.SandboxTemplatesGet(ctx, &client.SandboxTemplatesGetInput{TenantId: "acme", TemplateId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err))
	_, err = w.owner.SandboxTemplatesDelete(ctx, &client.SandboxTemplatesDeleteInput{TenantId: "acme", TemplateId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err), "deleted twice")
	in.Volumes = nil
	_, err = w.owner.SandboxTemplatesCreate(ctx, in)
	require.NoError(t, err, "the name is free again")
}
