package guestproto

// The guest's SSH server (docs/tunnels.md, "SSH"): a tunnel of kind ssh
// starts (OpStart) the program SSHServerProgram, which compute-guest runs
// as itself (`compute-guest ssh-serve`): an SSH server for one connection
// on its stdin and stdout, configured by the JSON SSHServe in the
// environment variable SSHServeEnv. No TCP port is opened; a guest without
// this build answers that the program does not exist.
const (
	SSHServerProgram = "compute-guest:ssh-serve"
	SSHServeEnv      = "COMPUTE_GUEST_SSH"
)

// SSHServe configures the guest's SSH server for one connection.
type SSHServe struct {
	// UserCAs are the CA keys (authorized_keys lines) whose user
	// certificates are accepted.
	UserCAs []string `json:"userCas"`
	// Scope: a user U logs in with a certificate holding U@<Scope>.
	Scope string `json:"scope"`
	// HostKey (OpenSSH PEM) and HostCertificate (authorized_keys form) are
	// the server's, made for this connection.
	HostKey         []byte `json:"hostKey"`
	HostCertificate string `json:"hostCertificate"`
}
