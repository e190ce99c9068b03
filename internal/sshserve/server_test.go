package sshserve

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"computeplane/internal/sshca"
)

func testCA(t *testing.T, now func() time.Time) *sshca.CA {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ca, err := sshca.New(key, now)
	require.NoError(t, err)
	return ca
}

// sshPair serves one connection of a server trusting ca for scope
// sbx_test on one end of a pipe and returns a client config maker for
// the other end.
type sshPair struct {
	t      *testing.T
	ca     *sshca.CA
	server *Server
}

func newSSHPair(t *testing.T, ca *sshca.CA) *sshPair { return newSSHPairHost(t, ca, ca) }

// newSSHPairHost trusts userCA for users and presents a host certificate
// of hostCA.
func newSSHPairHost(t *testing.T, ca, hostCA *sshca.CA) *sshPair {
	t.Helper()
	host, err := hostCA.NewHostKey("sbx_test")
	require.NoError(t, err)
	srv, err := New(Config{UserCAs: []string{ca.AuthorizedKey()}, Scope: "sbx_test", HostKey: host.PrivateKeyPEM,
		HostCertificate: host.Certificate}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	srv.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SANDBOX_ENV=kept"}
	return &sshPair{t: t, ca: ca, server: srv}
}

// certSigner is a fresh key with a certificate of ca for principals.
func certSigner(t *testing.T, ca *sshca.CA, principals ...string) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	key, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	cert, err := ca.SignUser(sshca.UserRequest{Key: key.PublicKey(), Principals: principals, KeyID: "test"})
	require.NoError(t, err)
	s, err := ssh.NewCertSigner(cert, key)
	require.NoError(t, err)
	return s
}

// dial connects a client as user with signer, trusting the server's host
// certificate only when signed by hostCA for sbx_test.
func (p *sshPair) dial(user string, signer ssh.Signer, hostCA ssh.PublicKey) (*ssh.Client, error) {
	a, b := socketPair(p.t)
	served := make(chan error, 1)
	go func() { served <- p.server.ServeConn(a) }()
	p.t.Cleanup(func() { a.Close(); b.Close() })
	hostCheck := &ssh.CertChecker{IsHostAuthority: func(auth ssh.PublicKey, _ string) bool {
		return string(auth.Marshal()) == string(hostCA.Marshal())
	}}
	c, chans, reqs, err := ssh.NewClientConn(b, "sbx_test:22", &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hostCheck.CheckHostKey, Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	return ssh.NewClient(c, chans, reqs), nil
}

func TestSSHServerRunsCommands(t *testing.T) {
	ca := testCA(t, nil)
	p := newSSHPair(t, ca)
	c, err := p.dial("root", certSigner(t, ca, "root@sbx_test", "root@acme"), ca.PublicKey())
	require.NoError(t, err)
	defer c.Close()

	run := func(cmd, stdin string) (string, string, error) {
		s, err := c.NewSession()
		require.NoError(t, err)
		defer s.Close()
		var out, errOut bytes.Buffer
		s.Stdout, s.Stderr, s.Stdin = &out, &errOut, strings.NewReader(stdin)
		err = s.Run(cmd)
		return out.String(), errOut.String(), err
	}
	out, errOut, err := run("read x; echo got $x; echo to-err >&2; echo $USER $HOME $SANDBOX_ENV; exit 7", "hello\n")
	var exit *ssh.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 7, exit.ExitStatus())
	assert.Equal(t, "got hello\nroot /root kept\n", out)
	assert.Equal(t, "to-err\n", errOut)

	// A command killed by a signal says which.
	_, _, err = run("kill -TERM $$", "")
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, "TERM", exit.Signal())

	// With a terminal: the program sees one of the asked size.
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.RequestPty("xterm-256color", 33, 101, ssh.TerminalModes{}))
	var ttyOut bytes.Buffer
	s.Stdout = &ttyOut
	require.NoError(t, s.Run("tty; stty size; echo $TERM"))
	assert.Regexp(t, `^/dev/pts/\d+\r\n33 101\r\nxterm-256color\r\n$`, ttyOut.String())

	// ssh -L: a connection to an address the guest reaches.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if conn, err := ln.Accept(); err == nil {
			_, _ = conn.Write([]byte("hello from a guest port\n"))
			conn.Close()
		}
	}()
	fwd, err := c.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	greeting, err := io.ReadAll(fwd)
	require.NoError(t, err)
	assert.Equal(t, "hello from a guest port\n", string(greeting))
	fwd.Close()

	// A command that does not read its input ends without waiting for it.
	s2, err := c.NewSession()
	require.NoError(t, err)
	defer s2.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	s2.Stdin = pr
	start := time.Now()
	require.NoError(t, s2.Run("true"))
	assert.Less(t, time.Since(start), 900*time.Millisecond)
}

func TestSSHServerRefusals(t *testing.T) {
	now := time.Now()
	ca := testCA(t, func() time.Time { return now })
	p := newSSHPair(t, ca)
	refused := func(user string, signer ssh.Signer) {
		t.Helper()
		_, err := p.dial(user, signer, ca.PublicKey())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "unable to authenticate")
	}
	// Another target, another account, another CA, a bare key, expired.
	refused("root", certSigner(t, ca, "root@sbx_other"))
	refused("admin", certSigner(t, ca, "root@sbx_test"))
	refused("root", certSigner(t, testCA(t, nil), "root@sbx_test"))
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	bare, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	refused("root", bare)
	old := testCA(t, func() time.Time { return now.Add(-time.Hour) })
	p = newSSHPairHost(t, old, ca)
	refused("root", certSigner(t, old, "root@sbx_test"))
	// An account the certificate names but the guest does not have.
	p = newSSHPair(t, ca)
	refused("nosuchuser", certSigner(t, ca, "nosuchuser@sbx_test"))

	// A client that trusts another CA for hosts refuses the server.
	p = newSSHPair(t, ca)
	_, err = p.dial("root", certSigner(t, ca, "root@sbx_test"), testCA(t, nil).PublicKey())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no authorities for hostname")
}

// socketPair is a connected pair of stream sockets (net.Pipe has no
// buffer: both ends of SSH write their version first).
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// A node's server (compute-agent's): sessions run the configured shell,
// not the account's, ssh -L is refused, and the end of the connection
// kills what its sessions left running.
func TestSSHServerConfiguredShell(t *testing.T) {
	ca := testCA(t, nil)
	dir := t.TempDir()
	shell := dir + "/shell"
	require.NoError(t, os.WriteFile(shell, []byte("#!/bin/sh\ncd "+dir+" || exit 1\nexport VIA=node-shell\nexec /bin/sh \"$@\"\n"), 0o755))
	host, err := ca.NewHostKey("sbx_test")
	require.NoError(t, err)
	srv, err := New(Config{UserCAs: []string{ca.AuthorizedKey()}, Scope: "sbx_test", HostKey: host.PrivateKeyPEM,
		HostCertificate: host.Certificate, Shell: []string{shell}, NoForwarding: true}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	p := &sshPair{t: t, ca: ca, server: srv}
	c, err := p.dial("root", certSigner(t, ca, "root@sbx_test"), ca.PublicKey())
	require.NoError(t, err)

	s, err := c.NewSession()
	require.NoError(t, err)
	out, err := s.Output("echo $VIA in $(pwd)")
	require.NoError(t, err)
	assert.Equal(t, "node-shell in "+dir+"\n", string(out))

	_, err = c.Dial("tcp", "127.0.0.1:1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not permitted")

	// A program left running: killed when the connection ends.
	s2, err := c.NewSession()
	require.NoError(t, err)
	pidOut, err := s2.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s2.Start("echo $$; exec sleep 100"))
	var pid int
	_, err = fmt.Fscan(pidOut, &pid)
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, 0), "running")
	c.Close()
	assert.Eventually(t, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(b), ") Z ")
	}, 5*time.Second, 20*time.Millisecond, "the session's program outlived its connection")
}
