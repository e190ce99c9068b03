package host

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/builtin"
	"computeplane/internal/config"
)

// Exec tunnels are built: the option starts; SSH is not yet and is refused.
func TestTunnelsOptionAcceptedButSSHRefused(t *testing.T) {
	cfg := &config.Config{Tunnels: &config.Tunnels{Issuer: "http://localhost:3000"}}
	require.NoError(t, CheckBuilt(cfg, builtin.All()))
	cfg.Tunnels.SSH = true
	err := CheckBuilt(cfg, builtin.All())
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "tunnels.ssh", ce.Option)
}
