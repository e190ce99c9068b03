package agent

// Break-glass access to the node itself (docs/tunnels.md, "Nodes"): a
// shell on a pseudo-terminal (tunnels of kind node-console) and the
// daemon's own SSH server (kind ssh to a node). Both run the operator's
// --node-console-command and nothing else: a daemon started without it
// refuses them, so a node never hands out a shell it was not told to.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/guestproto"
	"computeplane/internal/sshserve"
)

// errNoNodeShell is the refusal of a daemon without --node-console-command.
const errNoNodeShell = "this node serves no shell: its compute-agent runs without --node-console-command"

// serveNode serves a tunnel to the node: its console or its SSH server.
func (a *Agent) serveNode(st net.Conn, o tunnel.Open, exit func(int, string)) {
	if len(a.o.NodeConsoleCommand) == 0 {
		exit(-1, errNoNodeShell)
		return
	}
	a.log.Info("tunnel open", "tunnel", o.TunnelID, "kind", o.Kind, "target", "node")
	defer a.log.Info("tunnel closed", "tunnel", o.TunnelID)
	switch o.Kind {
	case tunnel.KindNodeConsole:
		code, err := a.nodeConsole(st, o)
		if err != nil {
			exit(-1, err.Error())
			return
		}
		exit(code, "")
	case tunnel.KindSSH:
		if o.SSH == nil || o.SSH.Scope != a.state.NodeID {
			exit(-1, "an ssh tunnel to a node names this node")
			return
		}
		srv, err := sshserve.New(sshserve.Config{UserCAs: o.SSH.UserCAs, Scope: o.SSH.Scope, HostKey: o.SSH.HostKey,
			HostCertificate: o.SSH.HostCertificate, Shell: a.o.NodeConsoleCommand, NoForwarding: true,
			Version: "SSH-2.0-compute-agent"}, a.log.With("tunnel", o.TunnelID))
		if err != nil {
			exit(-1, err.Error())
			return
		}
		srv.Env = nodeShellEnv("")
		c := newFrameConn(st)
		err = srv.ServeConn(c)
		c.Close()
		if err != nil {
			a.log.Warn("node ssh", "tunnel", o.TunnelID, "error", err.Error())
			exit(255, "")
			return
		}
		exit(0, "")
	default:
		exit(-1, "this compute-agent opens no tunnels of kind "+o.Kind+" to a node")
	}
}

// nodeShellEnv is the environment of node shells: a clean one (never the
// daemon's, which may hold its credentials' paths or tokens).
func nodeShellEnv(term string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	home, _ := os.UserHomeDir()
	if home == "" {
		home = "/"
	}
	env := []string{"PATH=" + path, "HOME=" + home, "LANG=C.UTF-8"}
	if term != "" {
		env = append(env, "TERM="+term)
	}
	return env
}

// nodeConsole runs the node's shell on a fresh pseudo-terminal, relays the
// tunnel's frames to it (stdin, resize, signal to its foreground job, the
// end of stdin as Ctrl-D) and answers its exit code (128 plus a signal's
// number). The tunnel's end kills the shell's session.
func (a *Agent) nodeConsole(st net.Conn, o tunnel.Open) (int, error) {
	argv := a.o.NodeConsoleCommand
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, fmt.Errorf("the node's console command: %w", err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: nodeShellEnv("xterm-256color")}
	size := &pty.Winsize{Cols: 80, Rows: 24}
	if o.Size != nil && o.Size.Cols > 0 && o.Size.Rows > 0 {
		size = &pty.Winsize{Cols: o.Size.Cols, Rows: o.Size.Rows}
	}
	ptmx, err := pty.StartWithAttrs(cmd, size, &syscall.SysProcAttr{Setsid: true, Setctty: true})
	if err != nil {
		return 0, fmt.Errorf("the node's console command: %w", err)
	}
	defer ptmx.Close()
	pid := cmd.Process.Pid
	waited := make(chan struct{})
	defer func() {
		select {
		case <-waited:
		default:
			_ = syscall.Kill(-pid, syscall.SIGKILL) // the tunnel ended first
		}
	}()
	go func() { // the tunnel's frames
		for {
			k, p, err := tunnel.ReadFrame(st)
			if err != nil {
				_ = syscall.Kill(-pid, syscall.SIGHUP) // the terminal hung up
				return
			}
			switch k {
			case tunnel.FrameStdin:
				_, _ = ptmx.Write(p)
			case tunnel.FrameEOF:
				_, _ = ptmx.Write([]byte{4}) // the terminal's EOF character
			case tunnel.FrameResize:
				var sz tunnel.Size
				if json.Unmarshal(p, &sz) == nil && sz.Cols > 0 && sz.Rows > 0 {
					_ = pty.Setsize(ptmx, &pty.Winsize{Cols: sz.Cols, Rows: sz.Rows})
				}
			case tunnel.FrameSignal:
				var sg tunnel.Signal
				if json.Unmarshal(p, &sg) != nil {
					continue
				}
				if sig, ok := guestproto.Signals[sg.Signal]; ok {
					// The terminal's foreground job, as a typed Ctrl-C would.
					pg, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPGRP)
					if err != nil || pg <= 0 {
						pg = pid
					}
					_ = syscall.Kill(-pg, syscall.Signal(sig))
				}
			}
		}
	}()
	out := make(chan struct{})
	go func() {
		defer close(out)
		buf := make([]byte, 32<<10)
		for {
			n, err := ptmx.Read(buf)
			if n > 0 && tunnel.WriteFrame(st, tunnel.FrameStdout, buf[:n]) != nil {
				return
			}
			if err != nil {
				return // EIO once every holder of the terminal is gone
			}
		}
	}()
	err = cmd.Wait()
	close(waited)
	select {
	case <-out:
	case <-time.After(time.Second): // a background process holds the terminal
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, err
	}
	return 0, nil
}

// frameConn is a net.Conn over a tunnel stream's frames: stdin frames are
// what it reads (the end of stdin its EOF), its writes stdout frames. The
// daemon's SSH server for a node serves one on it.
type frameConn struct {
	st   net.Conn
	pr   *io.PipeReader
	pw   *io.PipeWriter
	once sync.Once
}

func newFrameConn(st net.Conn) *frameConn {
	pr, pw := io.Pipe()
	c := &frameConn{st: st, pr: pr, pw: pw}
	go func() {
		for {
			k, p, err := tunnel.ReadFrame(st)
			if err != nil {
				_ = pw.CloseWithError(io.EOF)
				return
			}
			switch k {
			case tunnel.FrameStdin:
				if _, err := pw.Write(p); err != nil {
					return
				}
			case tunnel.FrameEOF:
				_ = pw.CloseWithError(io.EOF)
				return
			}
		}
	}()
	return c
}

func (c *frameConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *frameConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), tunnel.MaxFrame)
		if err := tunnel.WriteFrame(c.st, tunnel.FrameStdout, p[:k]); err != nil {
			return n, err
		}
		n, p = n+k, p[k:]
	}
	return n, nil
}

func (c *frameConn) Close() error {
	c.once.Do(func() { _ = c.pr.Close() })
	return nil
}

func (c *frameConn) LocalAddr() net.Addr              { return c.st.LocalAddr() }
func (c *frameConn) RemoteAddr() net.Addr             { return c.st.RemoteAddr() }
func (c *frameConn) SetDeadline(time.Time) error      { return nil }
func (c *frameConn) SetReadDeadline(time.Time) error  { return nil }
func (c *frameConn) SetWriteDeadline(time.Time) error { return nil }
