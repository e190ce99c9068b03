package tunnels

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/iam"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
)

// Dialer reaches the gateway holding a node's session (its internal API).
type Dialer interface {
	DialTunnel(ctx context.Context, node string) (*tunnel.Upstream, error)
}

// Relay serves GET {basePath}/tunnels/{ticket}: it redeems the ticket,
// dials the node's gateway, upgrades the client and relays frames both
// ways until either side ends, then writes the tunnel's end.
type Relay struct {
	Store    *store.Store
	Gateways Dialer
	Notifier *notify.Notifier
	Log      *slog.Logger
	// CheckEvery is how often the open tunnels' rows are read again
	// (closed by tunnels.close) and their idleness checked; default a
	// second.
	CheckEvery time.Duration
	// SSH makes the server side of tunnels of kind ssh (nil: none open).
	SSH *SSH
	// Identity is the re-authorizer's source (reauth.go): a revoked
	// session closes its tunnels when its event is heard, a role change
	// has them decided again, and every ReauthEvery (default 30 s) all are.
	// Nil: only tunnels.close and the ends close tunnels.
	Identity    Identity
	TypePrefix  string
	ReauthEvery time.Duration
	// IdleTimeout closes a tunnel through which nothing passed for so
	// long (tunnels.limits.idleTimeoutMs); 0 never.
	IdleTimeout time.Duration

	tracker tracker
}

// Shutdown closes every tunnel this relay holds (reason shutdown, a going
// away close for the client) and waits until ctx ends for their ends to be
// recorded. The host calls it after the HTTP listener closed (the
// specification's SIGTERM order); a tunnel asked for afterwards is
// refused UNAVAILABLE.
func (rl *Relay) Shutdown(ctx context.Context) error {
	return rl.tracked().shutdown(ctx)
}

// tracked is the relay's tracker, started at its first use.
func (rl *Relay) tracked() *tracker {
	rl.tracker.start.Do(func() {
		rl.tracker.rl = rl
		rl.tracker.run()
	})
	return &rl.tracker
}

func refuse(w http.ResponseWriter, log *slog.Logger, code api.Code, format string, args ...any) {
	rpc.WriteError(w, log, api.Errorf(code, format, args...))
}

func (rl *Relay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		refuse(w, rl.Log, api.CodeMethodNotAllowed, "a tunnel is a GET with a WebSocket upgrade")
		return
	}
	ticket := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	ctx := r.Context()
	q := db.New(rl.Store.Pool())
	// One round trip checks the ticket and consumes it.
	src := iam.SourceIPFromContext(ctx).String()
	row, err := q.RedeemTunnel(ctx, db.RedeemTunnelParams{TicketHash: HashTicket(ticket), SourceIp: src})
	if errors.Is(err, pgx.ErrNoRows) {
		refuse(w, rl.Log, api.CodeUnauthenticated, "the ticket is unknown")
		return
	}
	if err != nil {
		rpc.WriteError(w, rl.Log, err)
		return
	}
	if row.RedeemedAt == nil {
		if src != row.Tunnel.SourceIp {
			// Not consumed: the ticket stays its owner's.
			refuse(w, rl.Log, api.CodeAccessDenied, "the ticket was issued to another source address")
			return
		}
		refuse(w, rl.Log, api.CodeUnauthenticated, "the ticket was used, closed or expired")
		return
	}
	t := row.Tunnel // as found: make it the row as redeemed
	t.State, t.OpenedAt = "open", row.RedeemedAt
	start := time.Now()
	up, err := rl.Gateways.DialTunnel(ctx, t.NodeID)
	if err != nil {
		rl.finish(t, "failed", 0, 0, nil, start)
		retry := int64(1000)
		var busy *tunnel.Busy
		if errors.As(err, &busy) {
			retry = busy.RetryAfter.Milliseconds()
		}
		rpc.WriteError(w, rl.Log, api.Errorf(api.CodeUnavailable, "the target's node cannot be reached: %s", err.Error()).
			WithDetails(map[string]any{"retryAfterMs": max(retry, 1)}))
		return
	}
	defer up.Close()
	var argv []string
	_ = json.Unmarshal(t.Argv, &argv)
	var env map[string]string
	_ = json.Unmarshal(t.Env, &env)
	o := tunnel.Open{TunnelID: t.TunnelID, Kind: t.Kind, InstanceID: t.InstanceID, Argv: argv, Env: env, TTY: t.Tty, Port: int(t.Port.Int32)}
	if t.TargetKind == TargetNode {
		o.Target = tunnel.TargetNode
	}
	if t.TermCols.Valid && t.TermRows.Valid {
		o.Size = &tunnel.Size{Cols: uint16(t.TermCols.Int32), Rows: uint16(t.TermRows.Int32)}
	}
	if t.Kind == tunnel.KindSSH {
		if o.SSH, err = rl.SSH.sshOpen(t); err != nil {
			rl.finish(t, "failed", 0, 0, nil, start)
			rpc.WriteError(w, rl.Log, err)
			return
		}
	}
	open, _ := json.Marshal(o)
	if err := up.WriteFrame(tunnel.FrameOpen, open); err != nil {
		rl.finish(t, "failed", 0, 0, nil, start)
		rpc.WriteError(w, rl.Log, api.Errorf(api.CodeUnavailable, "the target's node cannot be reached"))
		return
	}
	reason := make(chan string, 1)
	lv := &live{row: t, caller: callerOf(t), end: func(why string) {
		select { // the first reason wins
		case reason <- why:
		default:
		}
	}}
	lv.touch()
	// tunnel.opened is written beside the relay (not before its first
	// frame: the open's latency); its end waits for it, so that the
	// closed event follows it.
	openedDone := make(chan struct{})
	if !rl.tracked().add(lv) {
		rl.finish(t, ReasonShutdown, 0, 0, nil, start)
		rpc.WriteError(w, rl.Log, api.Errorf(api.CodeUnavailable, "this api replica is stopping").
			WithDetails(map[string]any{"retryAfterMs": 1000}))
		return
	}
	defer rl.tracker.remove(t.TunnelID)
	client, err := websocket.Accept(clearDeadlines{w}, r, nil)
	if err != nil {
		rl.finish(t, "failed", 0, 0, nil, start)
		return
	}
	defer client.CloseNow()
	client.SetReadLimit(tunnel.MaxFrame + 1)
	go func() { defer close(openedDone); rl.opened(t) }()

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var in, out atomic.Int64
	var exitP atomic.Pointer[tunnel.Exit]
	go func() { // client -> node
		for {
			_, b, err := client.Read(rctx)
			if err != nil {
				lv.end("client")
				return
			}
			lv.touch()
			if len(b) == 0 || !tunnel.FromClient(b[0]) {
				continue // the client sends input only
			}
			if b[0] == tunnel.FrameStdin {
				in.Add(int64(len(b) - 1))
			}
			if up.WriteFrame(b[0], b[1:]) != nil {
				// The node's side closed: the other direction reads
				// what it sent before (its exit, a refusal) and ends
				// the tunnel with it.
				return
			}
		}
	}()
	go func() { // node -> client
		for {
			f, err := up.NextFrame()
			if err != nil {
				lv.end("node")
				return
			}
			lv.touch()
			b, kind := f.B, f.B[0]
			if kind == tunnel.FrameExit {
				var e tunnel.Exit
				if json.Unmarshal(b[1:], &e) == nil {
					exitP.Store(&e)
				}
			} else {
				out.Add(int64(len(b) - 1))
			}
			err = client.Write(rctx, websocket.MessageBinary, b)
			f.Release()
			if err != nil {
				lv.end("client")
				return
			}
			if kind == tunnel.FrameExit {
				lv.end("exited")
				return
			}
		}
	}()
	why := <-reason
	exit := exitP.Load()
	if why == "client" && exit != nil {
		// The client closed on the exit frame before this relay ended
		// the tunnel for it: the program's end came first.
		why = "exited"
	}
	var code *int32
	switch {
	case why == "exited" && (exit == nil || exit.Error != ""):
		why = "failed"
	case why == "exited" && (t.Kind == tunnel.KindExec || t.Kind == tunnel.KindNodeConsole):
		// Only a program has an exit code; the other kinds end when
		// their guest side closed (tcp) or the instance stopped.
		c := int32(exit.ExitCode)
		code = &c
	}
	closeCode, msg := websocket.StatusNormalClosure, why
	switch {
	case exit != nil && exit.Error != "":
		msg = exit.Error
	case why == "node" || why == ReasonShutdown:
		// Not the tunnel's own end: a client may open another (the
		// node's daemon reconnects, another api replica serves).
		closeCode = websocket.StatusGoingAway
	case why == ReasonRevoked:
		closeCode = websocket.StatusPolicyViolation
	}
	// Close before cancel: coder/websocket drops the connection, with no
	// close frame, as soon as the context of a pending Read ends, and the
	// client->node goroutine always has one pending. Close is bounded
	// (5 s for the frame, 5 s for the answer); a write stuck on a client
	// that reads nothing holds it up to the first.
	_ = client.Close(closeCode, truncate(msg, 120))
	cancel()
	<-openedDone
	rl.finish(t, why, in.Load(), out.Load(), code, start)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (rl *Relay) opened(t db.Tunnel) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := rl.Store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Event{Type: api.EventTunnelOpened, Subject: t.TunnelID, TenantID: t.TenantID,
			Data: api.TunnelOpenedPayload{TunnelID: t.TunnelID, IdentityID: t.IdentityID, TargetKind: t.TargetKind, TargetID: t.TargetID,
				Kind: t.Kind, NodeID: t.NodeID}})
	})
	rl.wake(err, t)
}

// finish records the tunnel's end and its event.
func (rl *Relay) finish(t db.Tunnel, why string, in, out int64, code *int32, start time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := rl.Store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		p := db.FinishTunnelParams{TunnelID: t.TunnelID, BytesIn: in, BytesOut: out}
		if code != nil {
			p.ExitCode = pgtype.Int4{Int32: *code, Valid: true}
		}
		row, err := db.New(tx).FinishTunnel(ctx, p)
		if err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Event{Type: api.EventTunnelClosed, Subject: t.TunnelID, TenantID: t.TenantID,
			Data: api.TunnelClosedPayload{TunnelID: t.TunnelID, Reason: why, BytesIn: in, BytesOut: out,
				DurationMs: time.Since(start).Milliseconds(), ExitCode: exitCode(row.ExitCode)}})
	})
	rl.wake(err, t)
}

func (rl *Relay) wake(err error, t db.Tunnel) {
	if err != nil {
		rl.Log.Warn("tunnels: recording", "tunnel", t.TunnelID, "error", err.Error())
		return
	}
	if rl.Notifier != nil {
		rl.Notifier.Wake(notify.TopicOutbox)
	}
}

// closedEvent is tunnel.closed for a ticket closed before its use.
func closedEvent(ctx context.Context, tx pgx.Tx, t db.Tunnel, why string) error {
	return outbox.Write(ctx, tx, outbox.Event{Type: api.EventTunnelClosed, Subject: t.TunnelID, TenantID: t.TenantID,
		Data: api.TunnelClosedPayload{TunnelID: t.TunnelID, Reason: why, ExitCode: exitCode(t.ExitCode)}})
}

// clearDeadlines lets the upgraded connection outlive the server's
// request deadlines (net/http keeps them on hijack).
type clearDeadlines struct{ http.ResponseWriter }

func (c clearDeadlines) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.ResponseWriter).Hijack()
	if err == nil {
		_ = conn.SetDeadline(time.Time{})
	}
	return conn, brw, err
}
