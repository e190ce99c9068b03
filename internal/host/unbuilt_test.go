package host

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/builtin"
	"computeplane/internal/config"
)

// Tunnels are built, SSH included: the options start.
func TestTunnelsOptionAccepted(t *testing.T) {
	cfg := &config.Config{Tunnels: &config.Tunnels{Issuer: "http://localhost:3000"}}
	require.NoError(t, CheckBuilt(cfg, builtin.All()))
	cfg.Tunnels.SSH = true
	require.NoError(t, CheckBuilt(cfg, builtin.All()))

	cfg.Modules = []string{"x"}
	var ce *config.Error
	require.ErrorAs(t, CheckBuilt(cfg, builtin.All()), &ce, "an option not built is still refused")
	assert.Equal(t, "modules", ce.Option)
}

// downloads.blob is built: it starts with the store's credentials in the
// environment and is INVALID_CONFIG without them.
func TestDownloadsBlobNeedsCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	cfg := &config.Config{Downloads: &config.Downloads{Blob: "s3://releases/x?endpoint=http://127.0.0.1:9000"}}
	var ce *config.Error
	require.ErrorAs(t, CheckBuilt(cfg, builtin.All()), &ce)
	assert.Equal(t, "downloads.blob", ce.Option)
	assert.Contains(t, ce.Message, "AWS_ACCESS_KEY_ID")
	t.Setenv("AWS_ACCESS_KEY_ID", "id")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	require.NoError(t, CheckBuilt(cfg, builtin.All()))
}

// Support bundles are built: the option starts with the blob store's
// credentials in the environment and is INVALID_CONFIG without them.
func TestSupportBundlesNeedCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	cfg := &config.Config{SupportBundles: &config.SupportBundles{Blob: "s3://bundles/x?endpoint=http://127.0.0.1:9000", MaxBytes: 1 << 20}}
	err := CheckBuilt(cfg, builtin.All())
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "supportBundles.blob", ce.Option)
	assert.Contains(t, ce.Message, "AWS_ACCESS_KEY_ID")
	t.Setenv("AWS_ACCESS_KEY_ID", "id")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	require.NoError(t, CheckBuilt(cfg, builtin.All()))
}
