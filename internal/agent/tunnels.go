package agent

import (
	"context"
	"encoding/json"
	"net"

	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/guestproto"
)

// serveTunnel runs one tunnel stream the gateway opened on the session:
// its open frame, then the program's output and exit one way and its
// stdin the other (docs/tunnels.md).
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
	err = json.Unmarshal(p, &o)
	if o.Kind == tunnel.KindSSH {
		o = sshExec(o) // the guest's SSH server, on the program's stdin and stdout
	}
	if err != nil || o.Kind != tunnel.KindExec || len(o.Argv) == 0 || o.Argv[0] == "" {
		exit(-1, "an exec tunnel needs its program")
		return
	}
	rt, ok := a.o.Runtime.(vmruntime.Streams)
	if !ok {
		exit(-1, "this node's runtime has no guests to reach")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := rt.Start(ctx, o.InstanceID, &guestproto.Exec{Argv: o.Argv, Env: o.Env})
	if err != nil {
		exit(-1, err.Error())
		return
	}
	defer s.Close() // kills the program when the tunnel ends first
	a.log.Info("tunnel open", "tunnel", o.TunnelID, "instance", o.InstanceID)
	go func() {
		// stdin, one chunk at a time (the guest answers each); the
		// stream's end (the client gone) ends the tunnel.
		defer cancel()
		for {
			k, p, err := tunnel.ReadFrame(st)
			if err != nil {
				return
			}
			switch k {
			case tunnel.FrameStdin:
				err = s.Input(ctx, guestproto.Input{Data: p})
			case tunnel.FrameEOF:
				err = s.Input(ctx, guestproto.Input{EOF: true})
			}
			if err != nil && ctx.Err() != nil {
				return
			}
		}
	}()
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
		n := int64(len(r.Output.Data))
		go func() { _ = s.Input(ctx, guestproto.Input{Ack: n}) }()
	}
}
