package tunnel

// SSH is what the SSH server at the end of a tunnel of kind ssh needs,
// made by the api at the ticket's redemption (docs/tunnels.md, "SSH").
type SSH struct {
	// UserCAs are the CA keys (authorized_keys lines) whose user
	// certificates the server accepts.
	UserCAs []string `json:"userCas"`
	// Scope is the target's id: the server accepts a user U whose
	// certificate holds the principal U@<Scope>.
	Scope string `json:"scope"`
	// HostKey (OpenSSH PEM) and HostCertificate (authorized_keys form)
	// are the server's, made for this tunnel alone.
	HostKey         []byte `json:"hostKey"`
	HostCertificate string `json:"hostCertificate"`
}
