package agent

import (
	"encoding/json"

	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/guestproto"
)

// sshExec turns the open of a tunnel of kind ssh into the exec of the
// guest's SSH server (guestproto.SSHServerProgram), which serves the
// connection on its stdin and stdout: from there the tunnel is an exec
// tunnel whose bytes are SSH's. An open without its SSH material stays
// what it is and is refused as a tunnel without a program.
func sshExec(o tunnel.Open) tunnel.Open {
	if o.SSH == nil {
		return o
	}
	cfg, _ := json.Marshal(guestproto.SSHServe{UserCAs: o.SSH.UserCAs, Scope: o.SSH.Scope, HostKey: o.SSH.HostKey,
		HostCertificate: o.SSH.HostCertificate})
	o.Kind, o.TTY, o.SSH = tunnel.KindExec, false, nil
	o.Argv = []string{guestproto.SSHServerProgram}
	o.Env = map[string]string{guestproto.SSHServeEnv: string(cfg)}
	return o
}
