package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// A --wait whose work ends failed exits 9 and says why: an instance of an
// image whose kernel is garbage, on a real agent with the qemu runtime
// (qemu refuses the kernel, so no guest boots).
func TestWaitEndingFailedExits9(t *testing.T) {
	qemutest.Image(t) // qemu is installed; the image itself is not used
	dir := t.TempDir()
	garbage := []byte(strings.Repeat("not a kernel\n", 1000))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "garbage"), garbage, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.json"), []byte(`{"id": "test/broken", "format": "kernel+initrd",
		"sizeBytes": 13000, "sha256": "`+strings.Repeat("0", 64)+`", "location": "garbage", "initrd": "garbage",
		"description": "a kernel qemu cannot load"}`), 0o644))
	f := fleettest.Start(t, "images: {dir: \""+dir+"\"}\n")
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "2", "--memory-mib", "1024", "--disk-gib", "100")
	env := map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant}

	r := cmd(t, env, "", "--output", "json", "instances", "create", "--pool-id", pool, "--flavor", "small", "--image-id", "test/broken", "--network", "none",
		"--name", "broken", "--idempotency-key", "b1", "--wait", "30s")
	require.Equal(t, cli.ExitFailed, r.code, "stdout %s\nstderr %s\nagent:\n%s", r.stdout, r.stderr, proctest.Tail(agent.Proc.Stderr.String(), 30))
	// The answer is printed, then why on stderr.
	assert.Contains(t, r.stdout, `"state": "failed"`)
	m := regexp.MustCompile(`(?m)^error: instances (inst_[0-9a-z]+) failed: (.+)$`).FindStringSubmatch(r.stderr)
	require.NotNil(t, m, r.stderr)
	got, err := f.C.InstancesGet(t.Context(), &client.InstancesGetInput{TenantId: fleettest.Tenant, InstanceId: m[1]})
	require.NoError(t, err)
	assert.Equal(t, "failed", string(got.Data.State))
	require.NotEmpty(t, got.Data.Error.Value)
	assert.Equal(t, got.Data.Error.Value, m[2], "the instance's error is printed")
}
