package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/term"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agentproto/tunnel"
)

// The tunnel commands (docs/tunnels.md) work like kubectl exec and
// port-forward and virsh console: exec runs a program in a sandbox or an
// instance with its streams attached (-t on a terminal in raw mode, its
// window size followed, Ctrl-C a byte for the remote terminal) and exits
// with its exit code; shell is exec -it of a login shell; port-forward
// listens on loopback and opens a tcp tunnel per connection; console
// attaches to an instance's serial console.

// tunnelCommands are the tunnel commands and their usage.
var tunnelCommands = []struct{ name, usage, summary string }{
	{"exec", "exec [-i] [-t] [-e NAME=VALUE]... TARGET -- COMMAND [ARG...]", "run a program in a sandbox or instance, its streams attached"},
	{"shell", "shell [-e NAME=VALUE]... TARGET", "an interactive login shell in a sandbox or instance (exec -it)"},
	{"port-forward", "port-forward TARGET [LOCAL:]REMOTE...", "forward local ports (127.0.0.1) to guest ports"},
	{"console", "console TARGET", "attach to the serial console of an instance or sandbox (Ctrl-] leaves)"},
	{"preview", "preview [--public|--private] [--host] TARGET PORT", "print the preview URL of a guest port (served over HTTP through the api)"},
}

func isTunnelCommand(name string) bool {
	for _, c := range tunnelCommands {
		if c.name == name {
			return true
		}
	}
	return false
}

func writeTunnelHelp(w io.Writer, name string) {
	for _, c := range tunnelCommands {
		if c.name == name {
			fmt.Fprintf(w, "%s: %s.\n\nUsage:\n  %s %s\n\n", c.name, c.summary, Program, c.usage)
		}
	}
	fmt.Fprint(w, `TARGET is a sandbox id (sbx_...) or an instance id (inst_...). shell and
console also take a node id (node_...): the node's console, its daemon's shell
on a terminal (break-glass: root tenant operators from an MFA session).

Flags:
  -i, --stdin        pass the standard input to the program (exec)
  -t, --tty          run the program on a terminal; on a local terminal in raw
                     mode, its size followed (exec; shell always)
  -e, --env NAME=VALUE  an environment variable of the program (exec, shell)
  --public, --private   make the preview public or private first (preview)
  --host                print the host-based preview URL (preview)

exec exits with the program's exit code (128 plus a signal's number when a
signal ended it). Without -t, Ctrl-C, SIGTERM and SIGHUP are sent to the
program; with -t on a terminal Ctrl-C is typed on the remote terminal.
port-forward prints "Forwarding from 127.0.0.1:LOCAL -> REMOTE" per port
(LOCAL 0 or absent picks a free one) and runs until interrupted; each
connection is a tunnel of its own. console shows the console's recent past,
then follows it; Ctrl-] leaves.
`)
	writeGlobalFlags(w)
}

// tunnelArgs are a tunnel command's parsed arguments.
type tunnelArgs struct {
	stdin, tty bool
	env        map[string]string
	target     client.TunnelTarget
	argv       []string
	forwards   [][2]int // local, remote
	// preview: the port, public true/false when asked, the host-based URL.
	port    int
	public  *bool
	hostURL bool
	// node is a node's id (node_...): shell and console open its console
	// (tunnels.openNode, break-glass).
	node string
}

func parseTunnelArgs(inv *invocation, args []string) (*tunnelArgs, error) {
	a := &tunnelArgs{env: map[string]string{}}
	name := inv.tunnel
	var pos []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if len(pos) > 0 && name == "exec" {
			// Everything after the target is the command.
			if arg == "--" {
				i++
			}
			a.argv = args[i:]
			break
		}
		if arg == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			pos = append(pos, arg)
			continue
		}
		flag, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		needValue := func() (string, error) {
			if hasValue {
				return value, nil
			}
			if i+1 >= len(args) {
				return "", usagef("flag %s needs a value", arg)
			}
			i++
			return args[i], nil
		}
		switch {
		case flag == "h" || flag == "help":
			inv.help = true
		case name == "exec" && strings.Trim(flag, "it") == "" && !strings.HasPrefix(arg, "--"):
			// -i, -t, -it, -ti
			a.stdin = a.stdin || strings.Contains(flag, "i")
			a.tty = a.tty || strings.Contains(flag, "t")
		case name == "preview" && (flag == "public" || flag == "private"):
			pub := flag == "public"
			a.public = &pub
		case name == "preview" && flag == "host":
			a.hostURL = true
		case name == "exec" && flag == "stdin":
			a.stdin = true
		case name == "exec" && flag == "tty":
			a.tty = true
		case (name == "exec" || name == "shell") && (flag == "e" || flag == "env"):
			v, err := needValue()
			if err != nil {
				return nil, err
			}
			k, val, ok := strings.Cut(v, "=")
			if !ok || k == "" {
				return nil, usagef("--env takes NAME=VALUE, not %q", v)
			}
			a.env[k] = val
		default:
			g, ok := globalName(flag)
			if !ok {
				return nil, usagef("unknown flag %s", arg)
			}
			if takesNoValue(g) {
				inv.global[g] = "true"
				continue
			}
			v, err := needValue()
			if err != nil {
				return nil, err
			}
			inv.global[g] = v
		}
	}
	if inv.help {
		return a, nil
	}
	if len(pos) == 0 {
		return nil, usagef("%s needs a TARGET (a sandbox id sbx_... or an instance id inst_...)", name)
	}
	switch t := pos[0]; {
	case strings.HasPrefix(t, "node_"):
		if name != "shell" && name != "console" {
			return nil, usagef("%s: a node (%s) has a console only: %s console %s", name, t, Program, t)
		}
		a.node = t
		if name == "console" {
			// A node's console is its daemon's shell: exec's terminal.
			inv.tunnel, a.stdin, a.tty = "shell", true, true
		}
	case strings.HasPrefix(t, "sbx_"):
		a.target = client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: t}
	case strings.HasPrefix(t, "inst_"):
		a.target = client.TunnelTarget{Kind: client.TunnelTargetKindInstance, ID: t}
	default:
		return nil, usagef("TARGET %q is neither a sandbox id (sbx_...) nor an instance id (inst_...)", t)
	}
	rest := pos[1:]
	switch name {
	case "exec":
		if len(a.argv) == 0 {
			return nil, usagef("exec needs a command: %s exec TARGET -- COMMAND [ARG...]", Program)
		}
	case "shell":
		a.stdin, a.tty = true, true
		if a.node == "" {
			a.argv = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}
		}
	case "port-forward":
		if len(rest) == 0 {
			return nil, usagef("port-forward needs ports: [LOCAL:]REMOTE")
		}
		for _, p := range rest {
			l, r, ok := strings.Cut(p, ":")
			if !ok {
				l, r = "0", p
			}
			local, err1 := strconv.Atoi(l)
			remote, err2 := strconv.Atoi(r)
			if err1 != nil || err2 != nil || local < 0 || local > 65535 || remote < 1 || remote > 65535 {
				return nil, usagef("port %q: [LOCAL:]REMOTE, ports 1 to 65535 (LOCAL 0: any free one)", p)
			}
			a.forwards = append(a.forwards, [2]int{local, remote})
		}
		rest = nil
	case "preview":
		if len(rest) != 1 {
			return nil, usagef("preview needs one guest PORT: %s preview TARGET PORT", Program)
		}
		p, err := strconv.Atoi(rest[0])
		if err != nil || p < 1 || p > 65535 {
			return nil, usagef("PORT %q: a port 1 to 65535", rest[0])
		}
		a.port, rest = p, nil
	}
	if len(rest) > 0 {
		return nil, usagef("unexpected arguments %q", rest)
	}
	return a, nil
}

// runTunnel runs a tunnel command.
func runTunnel(ctx context.Context, inv *invocation, getenv func(string) string, s Streams) (int, error) {
	a, err := parseTunnelArgs(inv, inv.rest)
	if err != nil {
		return 0, err
	}
	if inv.help {
		writeTunnelHelp(s.Stdout, inv.tunnel)
		return ExitOK, nil
	}
	set, err := inv.settings(getenv)
	if err != nil {
		return 0, err
	}
	if set.tenant == "" {
		if set.tenant, err = whoamiTenant(ctx, set); err != nil {
			return 0, err
		}
	}
	hc := &http.Client{Transport: http.DefaultTransport}
	c, err := computeclient.New(set.apiURL, computeclient.WithToken(set.token), computeclient.WithHTTPClient(hc))
	if err != nil {
		return 0, err
	}
	tc := &tunnels{set: set, c: c, hc: hc, s: s}
	switch inv.tunnel {
	case "port-forward":
		return tc.portForward(ctx, a)
	case "console":
		return tc.console(ctx, a)
	case "preview":
		return tc.preview(ctx, a)
	}
	if a.tty {
		if _, given := a.env["TERM"]; !given && getenv("TERM") != "" {
			a.env["TERM"] = getenv("TERM")
		}
	}
	return tc.exec(ctx, a)
}

type tunnels struct {
	set *settings
	c   *computeclient.Client
	hc  *http.Client
	s   Streams
}

// openError is an error tunnels.open answered, printed as every command
// prints one, with its exit code.
type openError struct{ e *computeclient.Error }

func (e *openError) Error() string { return e.e.Code + ": " + e.e.Message }

// asker asks for a ticket (tunnels.open or tunnels.openNode) and answers
// its URL.
type asker func(ctx context.Context) (string, error)

// ask is the asker of tunnels.open with in.
func (tc *tunnels) ask(in *client.TunnelsOpenInput) asker {
	return func(ctx context.Context) (string, error) {
		in.TenantId = tc.set.tenant
		res, err := tc.c.TunnelsOpen(ctx, in)
		if err != nil {
			return "", err
		}
		return res.Data.URL, nil
	}
}

// askNode is the asker of tunnels.openNode.
func (tc *tunnels) askNode(in *client.TunnelsOpenNodeInput) asker {
	return func(ctx context.Context) (string, error) {
		in.TenantId = tc.set.tenant
		res, err := tc.c.TunnelsOpenNode(ctx, in)
		if err != nil {
			return "", err
		}
		return res.Data.URL, nil
	}
}

// connect asks for a ticket and redeems it. A refusal of the upgrade
// (the node out of reach, a gateway's limit) is an openError like the
// API's, with its retryAfterMs.
func (tc *tunnels) connect(ctx context.Context, ask asker) (*websocket.Conn, error) {
	octx := ctx
	if tc.set.timeout > 0 {
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(ctx, tc.set.timeout)
		defer cancel()
	}
	url, err := ask(octx)
	if err != nil {
		if e, ok := computeclient.AsError(err); ok {
			return nil, &openError{e}
		}
		return nil, err
	}
	ws, resp, err := websocket.Dial(octx, url, &websocket.DialOptions{HTTPClient: tc.hc})
	if err != nil {
		if resp != nil {
			return nil, upgradeRefusal(resp)
		}
		return nil, err
	}
	ws.SetReadLimit(tunnel.MaxFrame + 1)
	return ws, nil
}

// upgradeRefusal reads the API error the relay answered the upgrade with.
func upgradeRefusal(resp *http.Response) error {
	var body struct {
		Error struct {
			Code         string         `json:"code"`
			Message      string         `json:"message"`
			RetryAfterMs *int64         `json:"retryAfterMs"`
			Details      map[string]any `json:"details"`
		} `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &body) != nil || body.Error.Code == "" {
		return fmt.Errorf("the tunnel's WebSocket: HTTP %d", resp.StatusCode)
	}
	e := body.Error
	return &openError{&computeclient.Error{Status: resp.StatusCode, Code: e.Code, Message: e.Message, RetryAfterMs: e.RetryAfterMs, Details: e.Details}}
}

// Reopening (port-forward and console): at most reopenTries tries, each
// after the server's retryAfterMs (a second when it gave none, at most
// reopenWaitMax), while the node's daemon restarts or its gateway drains.
const (
	reopenTries   = 30
	reopenWaitMax = 30 * time.Second
)

// retryable says whether an open's failure may pass by itself, and when
// to try again: UNAVAILABLE and RATE_LIMITED with their hint, and the
// service out of reach (a restart).
func retryable(err error) (time.Duration, bool) {
	var oe *openError
	if errors.As(err, &oe) {
		if oe.e.Code != "UNAVAILABLE" && oe.e.Code != "RATE_LIMITED" {
			return 0, false
		}
		wait := time.Second
		if oe.e.RetryAfterMs != nil {
			wait = time.Duration(*oe.e.RetryAfterMs) * time.Millisecond
		}
		return min(max(wait, 100*time.Millisecond), reopenWaitMax), true
	}
	return time.Second, err != nil
}

// reconnect is connect tried again while its failures are retryable;
// note, when set, hears each wait.
func (tc *tunnels) reconnect(ctx context.Context, ask asker, note func(err error, wait time.Duration)) (*websocket.Conn, error) {
	var err error
	for try := 0; try < reopenTries; try++ {
		var ws *websocket.Conn
		if ws, err = tc.connect(ctx, ask); err == nil {
			return ws, nil
		}
		wait, ok := retryable(err)
		if !ok || ctx.Err() != nil {
			return nil, err
		}
		if note != nil {
			note(err, wait)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
	return nil, err
}

// goingAway reports whether a tunnel's end is not its own (its node's
// daemon went away, its gateway drained, the api replica stopped): a
// client may open it again.
func goingAway(err error) bool {
	return websocket.CloseStatus(err) == websocket.StatusGoingAway
}

// closedWhy explains a tunnel's close to its user.
func closedWhy(err error) string {
	switch r := closeReason(err); r {
	case "node":
		return "the node's daemon went away (a restart, or its gateway drained)"
	case ReasonShutdownText:
		return "the api replica relaying it stopped"
	case "revoked":
		return "access was revoked (a revoked key or session, or a role that no longer allows it)"
	case "idle":
		return "nothing passed through it for the deployment's idle time"
	case "closed":
		return "it was closed (tunnels close)"
	default:
		return r
	}
}

// ReasonShutdownText is the close reason of a relay that stopped.
const ReasonShutdownText = "shutdown"

// ExitTunnelLost is exec's exit code when its tunnel closed before the
// program's end (ssh's for a lost connection).
const ExitTunnelLost = 255

// failed turns an open's error into an exit code.
func (tc *tunnels) failed(err error) (int, error) {
	var oe *openError
	if errors.As(err, &oe) {
		writeAPIError(tc.s.Stderr, oe.e)
		return ExitCode(oe.e.Code), nil
	}
	return 0, err
}

// frames writes a tunnel's frames; writes are safe from several
// goroutines (coder/websocket).
type frames struct{ ws *websocket.Conn }

func (f frames) send(ctx context.Context, kind byte, p []byte) error {
	for {
		n := min(len(p), tunnel.MaxFrame)
		if err := f.ws.Write(ctx, websocket.MessageBinary, append([]byte{kind}, p[:n]...)); err != nil {
			return err
		}
		if p = p[n:]; len(p) == 0 {
			return nil
		}
	}
}

func (f frames) sendJSON(ctx context.Context, kind byte, v any) error {
	b, _ := json.Marshal(v)
	return f.send(ctx, kind, b)
}

// terminal is the local terminal of a -t exec or a console: stdin's
// descriptor when it is one, and the descriptor that tells the size.
type terminal struct {
	in, size int
}

func localTerminal(s Streams) *terminal {
	f, ok := s.Stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	t := &terminal{in: int(f.Fd()), size: int(f.Fd())}
	if o, ok := s.Stdout.(*os.File); ok && term.IsTerminal(int(o.Fd())) {
		t.size = int(o.Fd())
	}
	return t
}

func (t *terminal) dims() *tunnel.Size {
	w, h, err := term.GetSize(t.size)
	if err != nil || w < 1 || h < 1 {
		return nil
	}
	return &tunnel.Size{Cols: uint16(min(w, 1000)), Rows: uint16(min(h, 1000))}
}

// raw puts the terminal in raw mode and returns its restore.
func (t *terminal) raw() (func(), error) {
	old, err := term.MakeRaw(t.in)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { _ = term.Restore(t.in, old) }) }, nil
}

// exec runs a program and returns its exit code.
func (tc *tunnels) exec(ctx context.Context, a *tunnelArgs) (int, error) {
	in := &client.TunnelsOpenInput{Target: a.target, Kind: client.TunnelsOpenInputKindExec, Argv: a.argv,
		Tty: client.NewOptBool(a.tty)}
	if len(a.env) > 0 {
		in.Env = client.NewOptTunnelsOpenInputEnv(a.env)
	}
	var size client.OptTerminalSize
	var t *terminal
	if a.tty {
		t = localTerminal(tc.s)
		if t != nil {
			if d := t.dims(); d != nil {
				size = client.NewOptTerminalSize(client.TerminalSize{Cols: int64(d.Cols), Rows: int64(d.Rows)})
			}
		}
	}
	in.Size = size
	ask := tc.ask(in)
	if a.node != "" {
		// A node's console: its daemon's shell on a terminal.
		ask = tc.askNode(&client.TunnelsOpenNodeInput{NodeId: a.node, Kind: client.TunnelsOpenNodeInputKindNodeConsole, Size: size})
	}
	ws, err := tc.connect(ctx, ask)
	if err != nil {
		return tc.failed(err)
	}
	defer ws.CloseNow()
	// The stream outlives an interrupt of computectl: it is passed on.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	f := frames{ws}
	restore := func() {}
	if t != nil && a.stdin {
		if restore, err = t.raw(); err != nil {
			return 0, err
		}
		defer restore()
	}
	if t != nil {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-bg.Done():
					return
				case <-winch:
					if d := t.dims(); d != nil {
						_ = f.sendJSON(bg, tunnel.FrameResize, d)
					}
				}
			}
		}()
	}
	if t == nil || !a.stdin {
		// Not in raw mode: the interrupts computectl gets are the
		// program's.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
		defer signal.Stop(sigs)
		go func() {
			for {
				select {
				case <-bg.Done():
					return
				case sig := <-sigs:
					_ = f.sendJSON(bg, tunnel.FrameSignal, tunnel.Signal{Signal: signalName(sig)})
				}
			}
		}()
	}
	if a.stdin && tc.s.Stdin != nil {
		go pumpStdin(bg, f, tc.s.Stdin)
	} else if !a.tty {
		_ = f.send(bg, tunnel.FrameEOF, nil) // no input: the program's stdin ends at once
	}
	for {
		_, b, err := ws.Read(bg)
		if err != nil {
			// A program is not resumed: its end is unknown, said as ssh
			// says a lost connection (255).
			restore()
			fmt.Fprintf(tc.s.Stderr, "\r\nerror: the tunnel closed before the program's end: %s\r\n", closedWhy(err))
			if goingAway(err) {
				fmt.Fprintf(tc.s.Stderr, "The program's fate is unknown; run it again once the node is back.\r\n")
			}
			return ExitTunnelLost, nil
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case tunnel.FrameStdout:
			_, _ = tc.s.Stdout.Write(b[1:])
		case tunnel.FrameStderr:
			_, _ = tc.s.Stderr.Write(b[1:])
		case tunnel.FrameExit:
			restore()
			var e tunnel.Exit
			_ = json.Unmarshal(b[1:], &e)
			if e.Error != "" {
				return 0, fmt.Errorf("the program could not run: %s", e.Error)
			}
			return execExit(e.ExitCode, false), nil
		}
	}
}

// pumpStdin sends what r yields as stdin frames, then the end of stdin.
func pumpStdin(ctx context.Context, f frames, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && f.send(ctx, tunnel.FrameStdin, buf[:n]) != nil {
			return
		}
		if err != nil {
			_ = f.send(ctx, tunnel.FrameEOF, nil)
			return
		}
	}
}

func closeReason(err error) string {
	if r := websocket.CloseStatus(err); r != -1 {
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Reason != "" {
			return ce.Reason
		}
		return fmt.Sprintf("status %d", r)
	}
	return err.Error()
}

// consoleEscape is the byte that leaves a console: Ctrl-], as telnet and
// virsh console have it.
const consoleEscape = 0x1d

// console attaches to a serial console until Ctrl-], an interrupt, or
// the instance's stop. A going-away close (the node's daemon restarted,
// its gateway drained) reopens it by itself: the console's recent past
// is shown again, then it follows.
func (tc *tunnels) console(ctx context.Context, a *tunnelArgs) (int, error) {
	ask := tc.ask(&client.TunnelsOpenInput{Target: a.target, Kind: client.TunnelsOpenInputKindConsole})
	ws, err := tc.connect(ctx, ask)
	if err != nil {
		return tc.failed(err)
	}
	var cur atomic.Pointer[websocket.Conn]
	cur.Store(ws)
	defer func() { cur.Load().CloseNow() }()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	restore := func() {}
	nl := "\n"
	if t := localTerminal(tc.s); t != nil {
		if restore, err = t.raw(); err != nil {
			return 0, err
		}
		defer restore()
		nl = "\r\n"
	}
	fmt.Fprintf(tc.s.Stderr, "Connected to the serial console of %s (Ctrl-] leaves).%s", a.target.ID, nl)
	left := make(chan struct{})
	if tc.s.Stdin != nil {
		go func() {
			// What is typed goes to the tunnel open now (typed while one
			// reopens, it is lost).
			buf := make([]byte, 32<<10)
			for {
				n, err := tc.s.Stdin.Read(buf)
				p := buf[:n]
				for i, c := range p {
					if c == consoleEscape {
						if i > 0 {
							_ = frames{cur.Load()}.send(cctx, tunnel.FrameStdin, p[:i])
						}
						close(left)
						cancel()
						return
					}
				}
				if len(p) > 0 {
					_ = frames{cur.Load()}.send(cctx, tunnel.FrameStdin, p)
				}
				if err != nil {
					return
				}
			}
		}()
	}
	for {
		_, b, err := cur.Load().Read(cctx)
		if err != nil {
			select {
			case <-left:
				restore()
				fmt.Fprintln(tc.s.Stderr)
				return ExitOK, nil
			default:
			}
			if ctx.Err() != nil {
				restore()
				return ExitOK, nil // interrupted
			}
			if !goingAway(err) {
				restore()
				return 0, fmt.Errorf("the console closed: %v", closedWhy(err))
			}
			fmt.Fprintf(tc.s.Stderr, "%sThe console's tunnel closed: %s; reopening.%s", nl, closedWhy(err), nl)
			ws, err := tc.reconnect(cctx, ask, func(err error, wait time.Duration) {
				fmt.Fprintf(tc.s.Stderr, "console: %v; trying again in %s.%s", err, wait.Round(time.Millisecond), nl)
			})
			if err != nil {
				restore()
				if ctx.Err() != nil || cctx.Err() != nil {
					return ExitOK, nil
				}
				return tc.failed(err)
			}
			cur.Swap(ws).CloseNow()
			fmt.Fprintf(tc.s.Stderr, "Reconnected to the serial console of %s.%s", a.target.ID, nl)
			continue
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case tunnel.FrameStdout:
			_, _ = tc.s.Stdout.Write(b[1:])
		case tunnel.FrameExit:
			restore()
			var e tunnel.Exit
			_ = json.Unmarshal(b[1:], &e)
			if e.Error != "" {
				return 0, fmt.Errorf("the console: %s", e.Error)
			}
			fmt.Fprintf(tc.s.Stderr, "%sThe instance stopped.\n", nl)
			return ExitOK, nil
		}
	}
}

// portForward forwards local ports until interrupted.
func (tc *tunnels) portForward(ctx context.Context, a *tunnelArgs) (int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for _, fw := range a.forwards {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(fw[0])))
		if err != nil {
			return 0, err
		}
		ls = append(ls, l)
		fmt.Fprintf(tc.s.Stdout, "Forwarding from %s -> %d\n", l.Addr(), fw[1])
	}
	var wg sync.WaitGroup
	for i, l := range ls {
		remote := a.forwards[i][1]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer conn.Close()
					if err := tc.forward(ctx, a.target, remote, conn.(*net.TCPConn)); err != nil && ctx.Err() == nil {
						fmt.Fprintf(tc.s.Stderr, "port-forward: a connection to %d: %v\n", remote, err)
					}
				}()
			}
		}()
	}
	<-ctx.Done()
	for _, l := range ls {
		_ = l.Close()
	}
	wg.Wait()
	return ExitOK, nil
}

// forward carries one local connection through a tcp tunnel.
// Its tunnel is opened again while the node's daemon restarts or its
// gateway drains (UNAVAILABLE with retryAfterMs, the service out of
// reach), a bounded number of times; a connection whose tunnel closed
// going away is closed (its bytes cannot be resumed): the next one opens
// a new tunnel.
func (tc *tunnels) forward(ctx context.Context, target client.TunnelTarget, port int, conn *net.TCPConn) error {
	ws, err := tc.reconnect(ctx, tc.ask(&client.TunnelsOpenInput{Target: target, Kind: client.TunnelsOpenInputKindTCP,
		Port: client.NewOptInt64(int64(port))}), func(err error, wait time.Duration) {
		fmt.Fprintf(tc.s.Stderr, "port-forward: a tunnel to %d: %v; trying again in %s\n", port, err, wait.Round(time.Millisecond))
	})
	if err != nil {
		var oe *openError
		if errors.As(err, &oe) {
			return oe
		}
		return err
	}
	defer ws.CloseNow()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go pumpStdin(fctx, frames{ws}, conn)
	for {
		_, b, err := ws.Read(fctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the tunnel closed: %v", closedWhy(err))
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case tunnel.FrameStdout:
			_ = conn.SetWriteDeadline(time.Now().Add(time.Minute))
			if _, err := conn.Write(b[1:]); err != nil {
				return nil // the local side left
			}
		case tunnel.FrameExit:
			var e tunnel.Exit
			_ = json.Unmarshal(b[1:], &e)
			if e.Error != "" {
				return errors.New(e.Error)
			}
			_ = conn.CloseWrite()
			return nil
		}
	}
}

// signalName names a signal as the tunnel's signal frame does.
func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGQUIT:
		return "QUIT"
	}
	return ""
}

// preview prints a guest port's preview URL: with its token as ?token=
// when private (the first hit sets a cookie), the host-based one with
// --host; the preview is made public or private when asked.
func (tc *tunnels) preview(ctx context.Context, a *tunnelArgs) (int, error) {
	in := &client.TunnelsPreviewInput{TenantId: tc.set.tenant, Target: a.target, Port: int64(a.port)}
	if a.public != nil {
		in.Public = client.NewOptBool(*a.public)
	}
	res, err := tc.c.TunnelsPreview(ctx, in)
	if err != nil {
		return 0, err
	}
	p := res.Data
	u := p.URL
	if a.hostURL {
		if p.HostUrl.Null {
			return 0, usagef("--host: this deployment has no preview domain (tunnels.previewDomain)")
		}
		u = p.HostUrl.Value
	}
	if !p.Public {
		u += "?token=" + p.Token
	}
	fmt.Fprintln(tc.s.Stdout, u)
	return ExitOK, nil
}
