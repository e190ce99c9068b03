package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/proctest"
	"computeplane/internal/testenv"
)

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(self), "..", "..", rel)
}

// The production example of docs/deploy.md (deploy/computed.yaml) is a
// configuration computed accepts, with the environment of
// deploy/computed.env.example; and a mistake in it is reported with its
// option path.
func TestProductionConfigurationChecks(t *testing.T) {
	computed := proctest.Build(t, "computeplane/cmd/computed")
	env := proctest.ChildEnv(map[string]string{
		"SERVICE_DATABASE_URL": "postgres://compute@db-1.internal:5432,db-2.internal:5432/compute?target_session_attrs=read-write",
		"SERVICE_SECRET":       testenv.TestSecret, "SERVICE_BASE_URL": "https://compute.example.com",
		"SERVICE_METRICS_TOKEN": "metrics-token-0123456789abcdef", "SERVICE_SKIP_MIGRATIONS": "1",
		"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-example",
	})
	file := repoFile(t, "deploy/computed.yaml")
	cmd := exec.Command(computed, "config", "check", file)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "computed.yaml: ok")

	// Every variable the env example names is one computed reads.
	b, err := os.ReadFile(repoFile(t, "deploy/computed.env.example"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			assert.True(t, strings.HasPrefix(k, "SERVICE_") || strings.HasPrefix(k, "AWS_"), k)
		}
	}

	// Without the blob stores' credentials, both blob options are refused.
	bad, err := os.ReadFile(file)
	require.NoError(t, err)
	broken := filepath.Join(t.TempDir(), "computed.yaml")
	require.NoError(t, os.WriteFile(broken, []byte(strings.Replace(string(bad), "trustedProxies: [10.0.1.10/32", "trustedProxies: [10.0.1.300/32", 1)), 0o600))
	cmd = exec.Command(computed, "config", "check", broken)
	cmd.Env = append(env, "AWS_ACCESS_KEY_ID=")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "INVALID_CONFIG: trustedProxies[0]")
	assert.Contains(t, string(out), "INVALID_CONFIG: downloads.blob")
	assert.Contains(t, string(out), "INVALID_CONFIG: supportBundles.blob")
}

// The units name the roles of the specification and the binary's
// commands.
func TestUnits(t *testing.T) {
	for unit, want := range map[string]string{
		"computed-api.service":     "Environment=SERVICE_ROLES=api\n",
		"computed-worker.service":  "Environment=SERVICE_ROLES=controllers,scheduler,sinks,iam\n",
		"computed-gateway.service": "Environment=SERVICE_ROLES=gateway\n",
		"compute-migrate.service":  "ExecStart=/usr/local/bin/computed migrate\n",
	} {
		b, err := os.ReadFile(repoFile(t, "deploy/"+unit))
		require.NoError(t, err)
		assert.Contains(t, string(b), want, unit)
		assert.Contains(t, string(b), "EnvironmentFile=/etc/compute/computed.env", unit)
		if _, err := exec.LookPath("systemd-analyze"); err == nil {
			out, err := exec.Command("systemd-analyze", "verify", repoFile(t, "deploy/"+unit)).CombinedOutput()
			// Only the unit's own syntax: the binary and user are not
			// installed here.
			for _, l := range strings.Split(string(out), "\n") {
				assert.NotContains(t, l, "Unknown key", unit)
				assert.NotContains(t, l, "Invalid", unit)
			}
			_ = err
		}
	}
}
