package cli

// computectl ssh: the system's OpenSSH client into a sandbox or instance
// through a tunnel (docs/tunnels.md, "SSH"), with a key pair made for the
// call and a certificate of minutes; nothing to copy by hand.
//
//	computectl ssh [-l ACCOUNT] [-o SSH_OPTION]... [-t] [ACCOUNT@]TARGET [--] [COMMAND...]
//
// ssh reaches the guest through `computectl tunnels ssh-proxy` (its
// ProxyCommand, not listed in the help): a tunnel of kind ssh whose
// frames carry the bytes of ssh's stdin and stdout. The server's host
// certificate is checked against the deployment's SSH CA for the target's
// id (a known_hosts @cert-authority line in the call's directory).

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/ssh"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agentproto/tunnel"
)

// EnvSSH names the ssh client computectl ssh runs (default ssh from PATH).
const EnvSSH = "COMPUTECTL_SSH"

const sshSummary = "log in to a sandbox or instance with the system's ssh client (a certificate of minutes)"

// runTerminalCommand runs the commands that are not API methods and own
// the terminal: ssh, and the hidden tunnels ssh-proxy. ok is false for any
// other command line.
func runTerminalCommand(ctx context.Context, groups []Group, args []string, getenv func(string) string, s Streams) (code int, ok bool) {
	i := firstPositional(args)
	if i < 0 {
		return 0, false
	}
	var run func(context.Context, *settings, []string, Streams) (int, error)
	var rest []string
	switch {
	case args[i] == "ssh":
		run, rest = sshCommand, args[i+1:]
	case args[i] == "tunnels" && i+1 < len(args) && args[i+1] == "ssh-proxy":
		run, rest = sshProxy, args[i+2:]
	default:
		return 0, false
	}
	if slices0(rest) == "-h" || slices0(rest) == "--help" {
		writeSSHHelp(s.Stdout)
		return ExitOK, true
	}
	inv, err := parse(groups, args[:i]) // the global flags before the command
	if err == nil && (inv.group != nil || inv.help) {
		err = usagef("unexpected arguments before %s", args[i])
	}
	var set *settings
	if err == nil {
		set, err = inv.settings(getenv)
	}
	if err == nil {
		code, err = run(ctx, set, rest, s)
	}
	if err != nil {
		fmt.Fprintf(s.Stderr, "error: %v\n", err)
		var ue *UsageError
		if errors.As(err, &ue) {
			fmt.Fprintf(s.Stderr, "Run '%s ssh --help' for usage.\n", Program)
			return ExitUsage, true
		}
		return ExitError, true
	}
	return code, true
}

func slices0(a []string) string {
	if len(a) == 0 {
		return ""
	}
	return a[0]
}

func writeSSHHelp(w io.Writer) {
	fmt.Fprintf(w, `%s ssh: %s.

Usage:
  %s [global flags] ssh [-l ACCOUNT] [-o SSH_OPTION]... [-t] [ACCOUNT@]TARGET [--] [COMMAND...]

TARGET is a sandbox (sbx_...) or instance (inst_...) id of the tenant, or a
node id (node_...: break-glass, root tenant operators from an MFA session, an
account of tunnels.sshAccounts); ACCOUNT defaults to root. Without COMMAND, a login shell. Exit status: the remote
command's, or 255 when ssh fails (as ssh's own).

Flags:
  -l, --account ACCOUNT  the account to log in as (default root)
  -o, --ssh-option OPT   an option for ssh (-o OPT), repeatable
  -t                     a terminal even with a COMMAND (ssh -tt)

The key pair is made for the call (Ed25519, in a private temporary directory
removed at the end) and certified for 5 minutes by the deployment's SSH CA
(tunnels issueSshCertificate). $%s names the ssh client (default ssh).
`, Program, sshSummary, Program, EnvSSH)
}

// sshTarget reads [account@]id.
func sshTarget(arg string) (account, kind, id string, err error) {
	account, id = "root", arg
	if a, rest, ok := strings.Cut(arg, "@"); ok {
		account, id = a, rest
	}
	switch {
	case strings.HasPrefix(id, "sbx_"):
		kind = "sandbox"
	case strings.HasPrefix(id, "inst_"):
		kind = "instance"
	case strings.HasPrefix(id, "node_"):
		kind = "node" // break-glass: the node's daemon serves SSH itself
	default:
		return "", "", "", usagef("the target %q is not a sandbox (sbx_...), instance (inst_...) or node (node_...) id", id)
	}
	return account, kind, id, nil
}

func sshCommand(ctx context.Context, set *settings, args []string, s Streams) (int, error) {
	var opts []string
	account, forceTTY := "", false
	target := ""
	var command []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case target != "":
			command = args[i:]
			if a == "--" {
				command = args[i+1:]
			}
			i = len(args)
		case a == "-t":
			forceTTY = true
		case a == "-l" || a == "--account" || a == "-o" || a == "--ssh-option":
			if i+1 >= len(args) {
				return 0, usagef("flag %s needs a value", a)
			}
			i++
			if a == "-l" || a == "--account" {
				account = args[i]
			} else {
				opts = append(opts, args[i])
			}
		case strings.HasPrefix(a, "--account="):
			account = strings.TrimPrefix(a, "--account=")
		case strings.HasPrefix(a, "--ssh-option="):
			opts = append(opts, strings.TrimPrefix(a, "--ssh-option="))
		case a == "--":
			if i+1 >= len(args) {
				return 0, usagef("missing the TARGET")
			}
			target = args[i+1]
			i++
		case strings.HasPrefix(a, "-"):
			return 0, usagef("unknown flag %s", a)
		default:
			target = a
		}
	}
	if target == "" {
		return 0, usagef("missing the TARGET (a sandbox or instance id)")
	}
	user, kind, id, err := sshTarget(target)
	if err != nil {
		return 0, err
	}
	if account != "" {
		user = account
	}
	bin := os.Getenv(EnvSSH)
	if bin == "" {
		bin = "ssh"
	}
	if bin, err = exec.LookPath(bin); err != nil {
		return 0, fmt.Errorf("no ssh client (%v): install OpenSSH's client (openssh-client)", err)
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	c, tenant, err := sshClient(ctx, set)
	if err != nil {
		return 0, err
	}

	// The key pair, its certificate and the host CA, in a directory of
	// this call only.
	dir, err := os.MkdirTemp("", "computectl-ssh-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return 0, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "computectl ssh "+id)
	if err != nil {
		return 0, err
	}
	spub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return 0, err
	}
	keyFile := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(blk), 0o600); err != nil {
		return 0, err
	}
	ictx, cancel := callContext(ctx, set)
	req := &client.TunnelsIssueSshCertificateInput{TenantId: tenant, PublicKey: string(ssh.MarshalAuthorizedKey(spub)),
		Account: client.NewOptString(user)}
	if kind == "node" {
		req.NodeId = client.NewOptString(id)
	} else {
		req.Target = client.NewOptTunnelTarget(client.TunnelTarget{Kind: client.TunnelTargetKind(kind), ID: id})
	}
	res, err := c.TunnelsIssueSshCertificate(ictx, req)
	cancel()
	if err != nil {
		return apiFailure(s, "tunnels.issueSshCertificate", err)
	}
	cert := res.Data
	certFile, knownHosts := keyFile+"-cert.pub", filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(certFile, []byte(cert.Certificate+"\n"), 0o600); err != nil {
		return 0, err
	}
	if err := os.WriteFile(knownHosts, []byte(cert.KnownHosts+"\n"), 0o600); err != nil {
		return 0, err
	}

	proxy := fmt.Sprintf("%s tunnels ssh-proxy --target-kind %s --target-id %s", shellQuote(self), kind, id)
	sshArgs := []string{"-F", "/dev/null",
		"-o", "IdentityFile=" + keyFile, "-o", "CertificateFile=" + certFile, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
		"-o", "UserKnownHostsFile=" + knownHosts, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
		"-o", "HostKeyAlias=" + cert.HostName, "-o", "ProxyCommand=" + strings.ReplaceAll(proxy, "%", "%%"),
		"-o", "LogLevel=ERROR", "-l", cert.User}
	for _, o := range opts {
		sshArgs = append(sshArgs, "-o", o)
	}
	if forceTTY {
		sshArgs = append(sshArgs, "-tt") // even when stdin is not a terminal
	}
	sshArgs = append(sshArgs, cert.HostName)
	if len(command) > 0 {
		sshArgs = append(append(sshArgs, "--"), command...)
	}
	cmd := exec.CommandContext(ctx, bin, sshArgs...)
	// The proxy finds the service as this call did (flags and profile
	// resolved), through the environment ssh hands its ProxyCommand.
	cmd.Env = append(withoutVars(os.Environ(), EnvURL, EnvBasePath, EnvToken, EnvTenant, EnvProfile),
		EnvURL+"="+set.origin, EnvBasePath+"="+strings.TrimPrefix(set.apiURL, set.origin), EnvToken+"="+set.token, EnvTenant+"="+tenant)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.Stdin, s.Stdout, s.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 0, err
	}
	return ExitOK, nil
}

// sshClient is the API client and the tenant of the call.
func sshClient(ctx context.Context, set *settings) (*computeclient.Client, string, error) {
	tenant := set.tenant
	if tenant == "" {
		var err error
		if tenant, err = whoamiTenant(ctx, set); err != nil {
			return nil, "", err
		}
	}
	c, err := computeclient.New(set.apiURL, computeclient.WithToken(set.token))
	return c, tenant, err
}

// callContext bounds one API call by --timeout (0: none).
func callContext(ctx context.Context, set *settings) (context.Context, context.CancelFunc) {
	if set.timeout == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, set.timeout)
}

// apiFailure prints an API error as the generated commands do and
// returns its exit code.
func apiFailure(s Streams, method string, err error) (int, error) {
	if e, ok := computeclient.AsError(err); ok {
		writeAPIError(s.Stderr, e)
		return ExitCode(e.Code), nil
	}
	return 0, fmt.Errorf("%s: %w", method, err)
}

// sshProxy is ssh's ProxyCommand: a tunnel of kind ssh, stdin to the
// guest's SSH server, its answers to stdout.
func sshProxy(ctx context.Context, set *settings, args []string, s Streams) (int, error) {
	var kind, id string
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "--target-kind":
			kind = args[i+1]
		case "--target-id":
			id = args[i+1]
		default:
			return 0, usagef("tunnels ssh-proxy: unknown flag %s", args[i])
		}
	}
	if kind == "" || id == "" {
		return 0, usagef("tunnels ssh-proxy needs --target-kind and --target-id")
	}
	c, tenant, err := sshClient(ctx, set)
	if err != nil {
		return 0, err
	}
	octx, cancel := callContext(ctx, set)
	var url string
	if kind == "node" {
		res, err := c.TunnelsOpenNode(octx, &client.TunnelsOpenNodeInput{TenantId: tenant, Kind: client.TunnelsOpenNodeInputKindSSH, NodeId: id})
		cancel()
		if err != nil {
			return apiFailure(s, "tunnels.openNode", err)
		}
		url = res.Data.URL
	} else {
		res, err := c.TunnelsOpen(octx, &client.TunnelsOpenInput{TenantId: tenant, Kind: client.TunnelsOpenInputKindSSH,
			Target: client.TunnelTarget{Kind: client.TunnelTargetKind(kind), ID: id}})
		cancel()
		if err != nil {
			return apiFailure(s, "tunnels.open", err)
		}
		url = res.Data.URL
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws, resp, err := websocket.Dial(dctx, url, nil)
	cancel()
	if err != nil {
		if resp != nil {
			err = upgradeRefusal(resp)
		}
		return 0, fmt.Errorf("the tunnel: %w", err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(tunnel.MaxFrame + 1)
	if s.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Stdin.Read(buf)
				if n > 0 && ws.Write(ctx, websocket.MessageBinary, append([]byte{tunnel.FrameStdin}, buf[:n]...)) != nil {
					return
				}
				if err != nil {
					_ = ws.Write(ctx, websocket.MessageBinary, []byte{tunnel.FrameEOF})
					return
				}
			}
		}()
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			// The relay ends the tunnel after the server's exit; an end
			// without one is the tunnel's failure (ssh says so).
			return 255, nil
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case tunnel.FrameStdout:
			if _, err := s.Stdout.Write(b[1:]); err != nil {
				return 255, nil
			}
		case tunnel.FrameStderr:
			_, _ = s.Stderr.Write(b[1:])
		case tunnel.FrameExit:
			var e tunnel.Exit
			_ = json.Unmarshal(b[1:], &e)
			if e.Error != "" {
				fmt.Fprintf(s.Stderr, "computectl: the guest's SSH server: %s\n", e.Error)
				return 255, nil
			}
			_ = ws.Close(websocket.StatusNormalClosure, "")
			return e.ExitCode, nil
		}
	}
}

// shellQuote quotes s for sh (ssh runs ProxyCommand with the user's shell).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// withoutVars is env without the variables named.
func withoutVars(env []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}
