package guest

// compute-guest's SSH server (docs/tunnels.md, "SSH"): a tunnel of kind
// ssh starts `compute-guest ssh-serve`, which serves one SSH connection on
// its stdin and stdout (internal/sshserve), so an image without sshd is
// reachable and no TCP port is opened. The tunnel's end kills its process
// group; the sessions' processes die with it (Pdeathsig), as an sshd's do
// with their connection.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"computeplane/internal/guestproto"
	"computeplane/internal/sshserve"
)

const sshServeCommand = "ssh-serve"

// ownProgram maps the SSH server's program name to compute-guest itself
// (/proc/self/exe at the exec: the running binary, even replaced on disk).
func ownProgram(argv []string) []string {
	if len(argv) > 0 && argv[0] == guestproto.SSHServerProgram {
		return []string{"/proc/self/exe", sshServeCommand}
	}
	return argv
}

// sshServeMain is `compute-guest ssh-serve`: the configuration from the
// environment (then removed from it: sessions do not see it), the
// connection on stdin and stdout.
func sshServeMain(*slog.Logger) int {
	// stderr reaches the client's terminal (the tunnel's stderr frames):
	// refusals only, which say why ssh was denied.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	raw := os.Getenv(guestproto.SSHServeEnv)
	_ = os.Unsetenv(guestproto.SSHServeEnv)
	var cfg guestproto.SSHServe
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "compute-guest ssh-serve: no configuration in %s\n", guestproto.SSHServeEnv)
		return 2
	}
	srv, err := sshserve.New(sshserve.Config{UserCAs: cfg.UserCAs, Scope: cfg.Scope, HostKey: cfg.HostKey, HostCertificate: cfg.HostCertificate}, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compute-guest ssh-serve:", err)
		return 2
	}
	if err := srv.ServeConn(sshserve.StdioConn{R: os.Stdin, W: os.Stdout}); err != nil {
		fmt.Fprintln(os.Stderr, "compute-guest ssh-serve:", err)
		return 1
	}
	return 0
}
