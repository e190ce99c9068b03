// Package sshserve is the SSH server of tunnels of kind ssh
// (docs/tunnels.md, "SSH"), shared by compute-guest (`compute-guest
// ssh-serve`, inside a VM) and compute-agent (a node's break-glass SSH):
// one connection at a time, served on whatever carries the tunnel's bytes,
// so no TCP port is opened. It accepts user certificates of the CAs it is
// given whose principal is <user>@<scope>, and serves sessions: a command
// or a shell, with or without a terminal, their exit status. The end of a
// connection kills the process groups of its sessions, as an sshd's end
// with its connection. It links no control-plane package (stdlib,
// golang.org/x/crypto/ssh, creack/pty and sshca's certificate rules).
package sshserve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"computeplane/internal/sshca"
)

// Config configures a server.
type Config struct {
	// UserCAs are the CA keys (authorized_keys lines) whose user
	// certificates are accepted.
	UserCAs []string
	// Scope: a user U logs in with a certificate holding U@<Scope>.
	Scope string
	// HostKey (OpenSSH PEM) and HostCertificate (authorized_keys form) are
	// the server's.
	HostKey         []byte
	HostCertificate string
	// Shell, when set, is what sessions run instead of the account's login
	// shell: Shell for a shell, Shell plus -c COMMAND for a command (a
	// node's --node-console-command).
	Shell []string
	// NoForwarding refuses direct-tcpip (ssh -L) whatever the certificate
	// permits (a node: its networks are not the caller's to reach).
	NoForwarding bool
	// Version is the server's identification (SSH-2.0-...).
	Version string
}

// Server serves SSH connections for one configuration.
type Server struct {
	config       *ssh.ServerConfig
	log          *slog.Logger
	shell        []string
	noForwarding bool
	// Env is the base environment of sessions (the process's when nil).
	Env []string
}

// New checks cfg and returns its server.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if cfg.Scope == "" || len(cfg.UserCAs) == 0 {
		return nil, errors.New("a server needs its CAs and scope")
	}
	checker := &sshca.UserChecker{Scope: cfg.Scope}
	for _, line := range cfg.UserCAs {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("a user CA: %w", err)
		}
		checker.CAs = append(checker.CAs, k)
	}
	host, err := (&sshca.HostKey{PrivateKeyPEM: cfg.HostKey, Certificate: cfg.HostCertificate}).Signer()
	if err != nil {
		return nil, err
	}
	s := &Server{log: log, shell: cfg.Shell, noForwarding: cfg.NoForwarding}
	version := cfg.Version
	if version == "" {
		version = "SSH-2.0-compute-guest"
	}
	s.config = &ssh.ServerConfig{
		ServerVersion: version,
		MaxAuthTries:  6,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			perms, err := checker.Check(meta, key)
			if err == nil {
				_, err = lookupAccount(meta.User())
			}
			if err != nil {
				log.Warn("ssh: refused", "user", meta.User(), "error", err.Error())
				return nil, err
			}
			if cert, ok := key.(*ssh.Certificate); ok {
				log.Info("ssh: accepted", "user", meta.User(), "keyId", cert.KeyId, "serial", cert.Serial)
			}
			return perms, nil
		},
	}
	s.config.AddHostKey(host)
	return s, nil
}

// ServeConn serves one connection until it ends.
func (s *Server) ServeConn(c net.Conn) error {
	sc, chans, reqs, err := ssh.NewServerConn(c, s.config)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	procs := &groups{}
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.session(sc.User(), sc.Permissions, ch, creqs, procs)
			}()
		case "direct-tcpip":
			if s.noForwarding || sc.Permissions == nil || !hasExt(sc.Permissions, "permit-port-forwarding") {
				_ = nc.Reject(ssh.Prohibited, "port forwarding is not permitted")
				continue
			}
			go forwardTCP(nc)
		default:
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions and direct-tcpip")
		}
	}
	// The connection ended: its sessions' programs end with it.
	procs.killAll()
	wg.Wait()
	return nil
}

// groups are the process groups of a connection's sessions.
type groups struct {
	mu   sync.Mutex
	pids map[int]bool
	done bool
}

func (g *groups) add(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return
	}
	if g.pids == nil {
		g.pids = map[int]bool{}
	}
	g.pids[pid] = true
}

func (g *groups) remove(pid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pids, pid)
}

func (g *groups) killAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.done = true
	for pid := range g.pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func hasExt(p *ssh.Permissions, name string) bool {
	_, ok := p.Extensions[name]
	return ok
}

// forwardTCP is ssh -L: a connection to an address as the guest sees it.
func forwardTCP(nc ssh.NewChannel) {
	var d struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &d); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "bad request")
		return
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(d.Host, strconv.Itoa(int(d.Port))), 10*time.Second)
	if err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		conn.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	go func() { _, _ = io.Copy(ch, conn); _ = ch.CloseWrite() }()
	_, _ = io.Copy(conn, ch)
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	time.AfterFunc(time.Second, func() { conn.Close(); ch.Close() })
}

// account is who a session runs as.
type account struct {
	uid, gid          uint32
	name, home, shell string
}

func lookupAccount(name string) (*account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if name == "root" { // an image without /etc/passwd
			return &account{name: "root", home: "/root", shell: "/bin/sh"}, nil
		}
		return nil, fmt.Errorf("no account %q in this guest", name)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("account %q: ids %s:%s", name, u.Uid, u.Gid)
	}
	return &account{uid: uint32(uid), gid: uint32(gid), name: name, home: u.HomeDir, shell: loginShell(name)}, nil
}

// loginShell is the account's shell in /etc/passwd (os/user does not
// say), /bin/sh otherwise.
func loginShell(name string) string {
	b, err := os.ReadFile("/etc/passwd")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) == 7 && f[0] == name && f[6] != "" {
				if _, err := os.Stat(f[6]); err == nil {
					return f[6]
				}
			}
		}
	}
	return "/bin/sh"
}

// ptyReq is a pty-req's payload (RFC 4254 6.2).
type ptyReq struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

type winch struct{ Cols, Rows, Width, Height uint32 }

// session serves one session channel: environment, terminal, then one
// shell or command, its exit status, the channel's end.
func (s *Server) session(userName string, perms *ssh.Permissions, ch ssh.Channel, reqs <-chan *ssh.Request, procs *groups) {
	defer ch.Close()
	var env []string
	var tty *ptyReq
	size := make(chan winch, 8)
	resize := func(r *ssh.Request) {
		var w winch
		if ssh.Unmarshal(r.Payload, &w) == nil {
			select {
			case size <- w:
			default: // a burst of changes: the next one counts
			}
		}
	}
	for req := range reqs {
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			ok := ssh.Unmarshal(req.Payload, &kv) == nil && acceptedEnv(kv.Name)
			if ok {
				env = append(env, kv.Name+"="+kv.Value)
			}
			_ = req.Reply(ok, nil)
		case "pty-req":
			var p ptyReq
			ok := ssh.Unmarshal(req.Payload, &p) == nil && hasExt(perms, "permit-pty")
			if ok {
				tty = &p
			}
			_ = req.Reply(ok, nil)
		case "window-change":
			resize(req)
		case "shell", "exec":
			var c struct{ Command string }
			if req.Type == "exec" && ssh.Unmarshal(req.Payload, &c) != nil {
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, nil)
			go func() {
				// The channel's later requests (window changes) are read
				// while the program runs; one program per session.
				for r := range reqs {
					if r.Type == "window-change" {
						resize(r)
					} else if r.WantReply {
						_ = r.Reply(false, nil)
					}
				}
			}()
			code, sig := s.run(userName, c.Command, req.Type == "shell", env, tty, size, ch, procs)
			if sig != "" {
				_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
					Signal     string
					CoreDumped bool
					Error      string
					Lang       string
				}{Signal: sig}))
			} else {
				_, _ = ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, uint32(code)))
			}
			return
		default:
			// Subsystems (sftp), X11 and agent forwarding are not served.
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}
}

// acceptedEnv are the variables a client may set (OpenSSH's AcceptEnv of
// Debian: the locale), and TERM's kin for terminals.
func acceptedEnv(name string) bool {
	return name == "LANG" || strings.HasPrefix(name, "LC_") || name == "COLORTERM"
}

// run runs the session's program as the account and returns its exit
// code, or the signal that ended it.
func (s *Server) run(userName, command string, shell bool, extra []string, tty *ptyReq, size <-chan winch, ch ssh.Channel, procs *groups) (int, string) {
	acct, err := lookupAccount(userName)
	if err != nil {
		fmt.Fprintln(ch.Stderr(), err)
		return 255, ""
	}
	argv := []string{acct.shell, "-c", command}
	if shell {
		argv = []string{"-" + filepath.Base(acct.shell)} // a login shell
	}
	cmd := &exec.Cmd{Path: acct.shell, Args: argv}
	if len(s.shell) > 0 {
		// The configured shell (a node's), not the account's.
		argv = slices.Clone(s.shell)
		if !shell {
			argv = append(argv, "-c", command)
		}
		path, err := exec.LookPath(argv[0])
		if err != nil {
			fmt.Fprintln(ch.Stderr(), err)
			return 127, ""
		}
		cmd = &exec.Cmd{Path: path, Args: argv}
	}
	cmd.Dir = acct.home
	if st, err := os.Stat(cmd.Dir); err != nil || !st.IsDir() {
		cmd.Dir = "/"
	}
	base := s.Env
	if base == nil {
		base = os.Environ()
	}
	cmd.Env = append(append(withoutVars(base, "HOME", "USER", "LOGNAME", "SHELL", "TERM"),
		"HOME="+acct.home, "USER="+acct.name, "LOGNAME="+acct.name, "SHELL="+acct.shell), extra...)
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if acct.uid != uint32(os.Getuid()) {
		attr.Credential = &syscall.Credential{Uid: acct.uid, Gid: acct.gid}
	}
	if tty != nil {
		return s.runTTY(cmd, attr, tty, size, ch, procs)
	}
	attr.Setpgid = true
	cmd.SysProcAttr = attr
	cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
	// A process the command leaves in the background holding its output
	// does not hold the session open past a second.
	cmd.WaitDelay = time.Second
	// stdin is copied by hand: a client that never ends its input (a
	// terminal) does not hold the end of the command; Wait closes the pipe.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintln(ch.Stderr(), err)
		return 255, ""
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(ch.Stderr(), err)
		return 127, ""
	}
	procs.add(cmd.Process.Pid)
	defer procs.remove(cmd.Process.Pid)
	go func() { _, _ = io.Copy(stdin, ch); _ = stdin.Close() }()
	return sshExitOf(cmd.Wait(), cmd)
}

func (s *Server) runTTY(cmd *exec.Cmd, attr *syscall.SysProcAttr, tty *ptyReq, size <-chan winch, ch ssh.Channel, procs *groups) (int, string) {
	if err := ensureDevpts(); err != nil {
		fmt.Fprintln(ch.Stderr(), "no terminals in this guest:", err)
		return 255, ""
	}
	term := tty.Term
	if term == "" {
		term = "xterm"
	}
	cmd.Env = append(cmd.Env, "TERM="+term)
	attr.Setsid, attr.Setctty = true, true
	cmd.SysProcAttr = attr
	ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: uint16(tty.Cols), Rows: uint16(tty.Rows)}, attr)
	if err != nil {
		fmt.Fprintln(ch.Stderr(), err)
		return 127, ""
	}
	defer ptmx.Close()
	procs.add(cmd.Process.Pid) // the session's leader: its group is its pid
	defer procs.remove(cmd.Process.Pid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			select {
			case w := <-size:
				_ = pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(w.Cols), Rows: uint16(w.Rows)})
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { _, _ = io.Copy(ptmx, ch) }()
	out := make(chan struct{})
	go func() {
		defer close(out)
		_, _ = io.Copy(ch, ptmx) // EIO once every holder of the terminal is gone
	}()
	err = cmd.Wait()
	select {
	case <-out:
	case <-time.After(time.Second): // a background process holds the terminal
	}
	return sshExitOf(err, cmd)
}

// sshExitOf is a finished command's exit code, or its signal's name.
func sshExitOf(err error, cmd *exec.Cmd) (int, string) {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 0, sshSignal(ws.Signal())
		}
		return exit.ExitCode(), ""
	}
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		return 255, ""
	}
	return cmd.ProcessState.ExitCode(), ""
}

// sshSignal is a signal's name as SSH sends it (RFC 4254 6.10: without SIG).
func sshSignal(sig syscall.Signal) string {
	name := unix.SignalName(sig)
	if name == "" {
		return "KILL"
	}
	return strings.TrimPrefix(name, "SIG")
}

// withoutVars is env without the variables named.
func withoutVars(env []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
}

// ensureDevpts mounts the terminals' filesystem when the guest's init did
// not (the minimal image mounts only what its agent needs).
func ensureDevpts() error {
	if _, err := os.Stat("/dev/pts/ptmx"); err == nil {
		return nil
	}
	if err := os.MkdirAll("/dev/pts", 0o755); err != nil {
		return err
	}
	err := syscall.Mount("devpts", "/dev/pts", "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "ptmxmode=0666,mode=0620")
	if err != nil && !errors.Is(err, syscall.EBUSY) {
		return err
	}
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		return os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	return nil
}

// StdioConn is a net.Conn over a reader and a writer (compute-guest's
// connection on its stdin and stdout).
type StdioConn struct {
	R io.Reader
	W io.Writer
}

func (c StdioConn) Read(p []byte) (int, error)  { return c.R.Read(p) }
func (c StdioConn) Write(p []byte) (int, error) { return c.W.Write(p) }
func (c StdioConn) Close() error {
	if cl, ok := c.W.(io.Closer); ok {
		_ = cl.Close()
	}
	if cl, ok := c.R.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "tunnel" }

func (StdioConn) LocalAddr() net.Addr              { return pipeAddr{} }
func (StdioConn) RemoteAddr() net.Addr             { return pipeAddr{} }
func (StdioConn) SetDeadline(time.Time) error      { return nil }
func (StdioConn) SetReadDeadline(time.Time) error  { return nil }
func (StdioConn) SetWriteDeadline(time.Time) error { return nil }
