package agent

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// agentSide are the packages of this module the node daemon may link:
// the protocols it speaks (agentproto with the gateway, guestproto with
// its guests), the release format and its own code. Anything else of the control plane stays
// out of it: the two meet only in agentproto.
var agentSide = []string{
	"computeplane/cmd/compute-agent",
	"computeplane/internal/agent",
	"computeplane/internal/agentproto",
	"computeplane/internal/guestproto",
	"computeplane/internal/qemu",
	"computeplane/internal/buildinfo",
	// The release format: the control plane signs and serves what the
	// daemon verifies (stdlib and x/mod only).
	"computeplane/internal/release",
	// INVALID_CONFIG's form, shared with the control plane's
	// configuration (stdlib only).
	"computeplane/internal/configerr",
	// The SSH server of tunnels (a node's break-glass SSH, as
	// compute-guest's) and the certificate rules it checks with: the api
	// signs what the daemon verifies (stdlib and x/crypto/ssh only).
	"computeplane/internal/sshserve",
	"computeplane/internal/sshca",
}

// serverImports returns the packages of this module in deps that are not
// on the agent's side.
func serverImports(deps []string) []string {
	var out []string
	for _, d := range deps {
		if d != "computeplane" && !strings.HasPrefix(d, "computeplane/") {
			continue // the standard library and third parties
		}
		ok := false
		for _, a := range agentSide {
			ok = ok || d == a || strings.HasPrefix(d, a+"/")
		}
		if !ok {
			out = append(out, d)
		}
	}
	return out
}

func TestTheAgentImportsNoServerPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "computeplane/cmd/compute-agent").Output()
	require.NoError(t, err, "go list")
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "computeplane/internal/agentproto")
	assert.Empty(t, serverImports(deps), "the node daemon links control-plane packages")
	// The check sees one.
	assert.Equal(t, []string{"computeplane/internal/gateway", "computeplane/gen/db"},
		serverImports([]string{"fmt", "computeplane/internal/agent/vmruntime", "computeplane/internal/gateway", "computeplane/gen/db", "github.com/coder/websocket"}))
}
