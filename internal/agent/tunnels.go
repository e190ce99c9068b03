package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// serveTunnel runs one tunnel stream the gateway opened on the session:
// its open frame, then by kind a program in the guest (exec), a
// connection to a guest port (tcp) or the serial console (console)
// (docs/tunnels.md).
func (a *Agent) serveTunnel(st net.Conn) {
	defer st.Close()
	kind, p, err := tunnel.ReadFrame(st)
	if err != nil || kind != tunnel.FrameOpen {
		return
	}
	exit := func(code int, msg string) {
		b, _ := json.Marshal(tunnel.Exit{ExitCode: code, Error: msg})
		_ = tunnel.WriteFrame(st, tunnel.FrameExit, b)
	}
	var o tunnel.Open
	if err := json.Unmarshal(p, &o); err != nil {
		exit(-1, "a tunnel's open frame is JSON")
		return
	}
	if o.Target == tunnel.TargetNode {
		a.serveNode(st, o, exit)
		return
	}
	if o.Kind == tunnel.KindSSH {
		o = sshExec(o) // the guest's SSH server, on the program's stdin and stdout
	}
	rt, ok := a.o.Runtime.(vmruntime.Streams)
	if !ok {
		exit(-1, "this node's runtime has no guests to reach")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var s *qemu.Stream
	switch o.Kind {
	case tunnel.KindExec:
		if len(o.Argv) == 0 || o.Argv[0] == "" {
			exit(-1, "an exec tunnel needs its program")
			return
		}
		e := &guestproto.Exec{Argv: o.Argv, Env: o.Env, TTY: o.TTY}
		if o.Size != nil {
			e.Size = &guestproto.Size{Cols: o.Size.Cols, Rows: o.Size.Rows}
		}
		s, err = rt.Start(ctx, o.InstanceID, e)
	case tunnel.KindTCP:
		if o.Port < 1 || o.Port > 65535 {
			exit(-1, "a tcp tunnel needs its port")
			return
		}
		s, err = rt.Dial(ctx, o.InstanceID, o.Port)
	case tunnel.KindConsole:
		a.serveConsole(st, rt, o, exit)
		return
	default:
		exit(-1, "this compute-agent opens no tunnels of kind "+o.Kind)
		return
	}
	if err != nil {
		exit(-1, err.Error())
		return
	}
	defer s.Close() // kills the program (closes the connection) when the tunnel ends first
	a.log.Info("tunnel open", "tunnel", o.TunnelID, "kind", o.Kind, "instance", o.InstanceID)
	go func() {
		// stdin, one chunk at a time (the guest answers each); the
		// stream's end (the client gone) ends the tunnel.
		defer cancel()
		for {
			k, p, err := tunnel.ReadFrame(st)
			if err != nil {
				return
			}
			var in guestproto.Input
			switch k {
			case tunnel.FrameStdin:
				in.Data = p
			case tunnel.FrameEOF:
				in.EOF = true
			case tunnel.FrameResize:
				var sz tunnel.Size
				if json.Unmarshal(p, &sz) != nil || sz.Cols == 0 || sz.Rows == 0 {
					continue
				}
				in.Resize = &guestproto.Size{Cols: sz.Cols, Rows: sz.Rows}
			case tunnel.FrameSignal:
				var sg tunnel.Signal
				if json.Unmarshal(p, &sg) != nil {
					continue
				}
				if _, known := guestproto.Signals[sg.Signal]; !known {
					continue
				}
				in.Signal = sg.Signal
			default:
				continue
			}
			// A refused input (a resize without a terminal, a signal to
			// a connection) leaves the tunnel open.
			if err := s.Input(ctx, in); err != nil && ctx.Err() != nil {
				return
			}
		}
	}()
	var unacked int64
	for {
		r, err := s.Next(ctx)
		if err != nil {
			exit(-1, err.Error())
			return
		}
		if r.Output == nil {
			if !r.OK {
				exit(-1, r.Error)
			} else {
				exit(r.Exec.ExitCode, "")
			}
			a.log.Info("tunnel closed", "tunnel", o.TunnelID)
			return
		}
		fk := tunnel.FrameStdout
		if r.Output.Fd == 2 {
			fk = tunnel.FrameStderr
		}
		// The write waits while the gateway's window is full: the
		// program's output then waits in the guest, not here.
		if err := tunnel.WriteFrame(st, fk, r.Output.Data); err != nil {
			return
		}
		// Acknowledged a quarter window at a time, not per chunk: the
		// guest never waits for it (three quarters stay in flight) and
		// answers a quarter of the calls.
		if unacked += int64(len(r.Output.Data)); unacked >= guestproto.StreamWindow/4 {
			n := unacked
			unacked = 0
			go func() { _ = s.Input(ctx, guestproto.Input{Ack: n}) }()
		}
	}
}

// serveConsole relays an instance's serial console: its recent past and
// then its output as stdout frames, stdin frames typed on it, until the
// client leaves or the instance stops.
func (a *Agent) serveConsole(st net.Conn, rt vmruntime.Streams, o tunnel.Open, exit func(int, string)) {
	c, err := rt.Console(o.InstanceID)
	if err != nil {
		exit(-1, err.Error())
		return
	}
	defer c.Close()
	a.log.Info("tunnel open", "tunnel", o.TunnelID, "kind", o.Kind, "instance", o.InstanceID)
	go func() {
		defer c.Close() // the client gone: the reader below ends
		for {
			k, p, err := tunnel.ReadFrame(st)
			if err != nil {
				return
			}
			if k == tunnel.FrameStdin && len(p) > 0 {
				if _, err := c.Write(p); err != nil {
					return
				}
			}
		}
	}()
	buf := make([]byte, 16<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if tunnel.WriteFrame(st, tunnel.FrameStdout, buf[:n]) != nil {
				return
			}
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			exit(0, "") // the instance stopped
			a.log.Info("tunnel closed", "tunnel", o.TunnelID)
			return
		}
	}
}
