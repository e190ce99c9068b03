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

	cfg.Downloads = &config.Downloads{}
	var ce *config.Error
	require.ErrorAs(t, CheckBuilt(cfg, builtin.All()), &ce, "an option not built is still refused")
	assert.Equal(t, "downloads", ce.Option)
}
