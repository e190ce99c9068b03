package tunnels_test

// The re-authorizer, the node-side limits and the ends of tunnels at a
// restart, through real processes (computed with every role, a
// compute-agent with the qemu runtime) and a sandbox that is a real VM
// (TCG): a revoked key's tunnel and a demoted identity's tunnel close
// within a second, a node's open tunnels are bounded (UNAVAILABLE with
// retryAfterMs), an idle tunnel closes with its bytes and duration
// counted, and the tunnels of a computed stopped with SIGTERM and of a
// restarted daemon end with a going-away close, the client opening
// another once they are back.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/cli"
	"computeplane/internal/config"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

// catTunnel is an exec tunnel running cat: what it is sent comes back.
type catTunnel struct {
	t  *testing.T
	id string
	ws *websocket.Conn
}

// openCat opens a cat tunnel with c into sandbox and checks that it echoes.
func openCat(t *testing.T, c *computeclient.Client, sandbox string) *catTunnel {
	t.Helper()
	tk, err := c.TunnelsOpen(t.Context(), &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec,
		Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: sandbox}, Argv: []string{"cat"}})
	require.NoError(t, err)
	ws, _, err := websocket.Dial(t.Context(), tk.Data.URL, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ws.CloseNow() })
	ct := &catTunnel{t: t, id: tk.Data.Tunnel.TunnelId, ws: ws}
	ct.echo("ping\n")
	return ct
}

// echo sends s and reads it back.
func (c *catTunnel) echo(s string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(c.t, c.ws.Write(ctx, websocket.MessageBinary, append([]byte{tunnel.FrameStdin}, s...)))
	var got strings.Builder
	for got.Len() < len(s) {
		_, b, err := c.ws.Read(ctx)
		require.NoError(c.t, err)
		if len(b) > 0 && b[0] == tunnel.FrameStdout {
			got.Write(b[1:])
		}
	}
	require.Equal(c.t, s, got.String())
}

// closed waits up to within for the api to close the tunnel and returns
// the close status and how long it took.
func (c *catTunnel) closed(within time.Duration) (websocket.StatusCode, string, time.Duration) {
	c.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(c.t.Context(), within)
	defer cancel()
	for {
		_, _, err := c.ws.Read(ctx)
		if err != nil {
			require.NoError(c.t, ctx.Err(), "the tunnel stayed open for %s", within)
			var ce websocket.CloseError
			reason := ""
			if asClose(err, &ce) {
				reason = ce.Reason
			}
			return websocket.CloseStatus(err), reason, time.Since(start)
		}
	}
}

func asClose(err error, ce *websocket.CloseError) bool {
	for ; err != nil; err = unwrap(err) {
		if e, ok := err.(websocket.CloseError); ok {
			*ce = e
			return true
		}
	}
	return false
}

func unwrap(err error) error {
	u, ok := err.(interface{ Unwrap() error })
	if !ok {
		return nil
	}
	return u.Unwrap()
}

// closedEvent is the data of a tunnel's tunnel.closed event, once written.
type closedEvent struct {
	Reason     string `json:"reason"`
	BytesIn    int64  `json:"bytesIn"`
	BytesOut   int64  `json:"bytesOut"`
	DurationMs int64  `json:"durationMs"`
}

func tunnelClosed(t *testing.T, f *fleettest.Fleet, id string) closedEvent {
	t.Helper()
	var e closedEvent
	require.Eventually(t, func() bool {
		var data []byte
		if f.DB.QueryRow(t.Context(), `select data from outbox where type = 'tunnel.closed' and subject = $1`, id).Scan(&data) != nil {
			return false
		}
		require.NoError(t, json.Unmarshal(data, &e))
		return true
	}, 10*time.Second, 20*time.Millisecond)
	return e
}

func newClient(t *testing.T, f *fleettest.Fleet, key string) *computeclient.Client {
	c, err := computeclient.New(f.PublicURL+config.DefaultBasePath, computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 60 * time.Second}))
	require.NoError(t, err)
	return c
}

// tunnelFleet starts a fleet with tunnels.limits limits and a qemu
// compute-agent, and a running sandbox (a TCG VM) on it; it returns the
// fleet, the agent and the sandbox's id.
func tunnelFleet(t *testing.T, limits string) (*fleettest.Fleet, *fleettest.Agent, string) {
	t.Helper()
	im := qemutest.Image(t)
	// A notifier: revocations are pushed (the identity inbox is woken at
	// the event's commit), not waited for.
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\nnotifier: {kind: postgres}\n", filepath.Dir(filepath.Dir(im.Location))),
		fleettest.TunnelLimits(limits))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 80), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone), Flavor: "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	id := sbx.Data.SandboxId
	require.Eventually(t, func() bool {
		g, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: id})
		require.NoError(t, err)
		return g.Data.State == "running"
	}, 120*time.Second, 100*time.Millisecond)
	return f, agent, id
}

func TestTunnelReauthorizerAndLimits(t *testing.T) {
	f, _, id := tunnelFleet(t, "{openPerNode: 2, idleTimeoutMs: 4000, tunnelsPerMinute: 60}")
	ctx := t.Context()

	t.Run("a revoked key's tunnel closes within a second", func(t *testing.T) {
		key := f.CreateKey(fleettest.Tenant, "dev", "owner")
		cat := openCat(t, newClient(t, f, key), id)
		other := openCat(t, f.C, id) // another identity's stays open
		f.RunComputed("iam", "revoke-key", "--key-id", key[4:20])
		status, reason, took := cat.closed(5 * time.Second)
		t.Logf("closed %s after the revocation committed", took)
		assert.Less(t, took, time.Second)
		assert.Equal(t, websocket.StatusPolicyViolation, status)
		assert.Equal(t, "revoked", reason)
		assert.Equal(t, "revoked", tunnelClosed(t, f, cat.id).Reason)
		other.echo("still here\n")
		require.NoError(t, other.ws.Close(websocket.StatusNormalClosure, ""))
	})

	t.Run("a demoted identity's tunnel closes within a second", func(t *testing.T) {
		cat := openCat(t, newClient(t, f, f.CreateKey(fleettest.Tenant, "dev2", "owner")), id)
		f.RunComputed("iam", "set-role", "--tenant", fleettest.Tenant, "--identity", "dev2", "--role", "viewer")
		status, reason, took := cat.closed(5 * time.Second)
		t.Logf("closed %s after the role change committed", took)
		assert.Less(t, took, time.Second)
		assert.Equal(t, websocket.StatusPolicyViolation, status)
		assert.Equal(t, "revoked", reason)
	})

	t.Run("open tunnels per node are bounded and an idle one closes", func(t *testing.T) {
		a, b := openCat(t, f.C, id), openCat(t, f.C, id)
		// The third: refused at the gateway, UNAVAILABLE with the hint.
		tk, err := f.C.TunnelsOpen(ctx, &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec,
			Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}, Argv: []string{"cat"}})
		require.NoError(t, err)
		_, resp, err := websocket.Dial(ctx, tk.Data.URL, nil)
		require.Error(t, err)
		require.NotNil(t, resp)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		body, _ := io.ReadAll(resp.Body)
		var refusal struct {
			Error struct {
				Code         string `json:"code"`
				Message      string `json:"message"`
				RetryAfterMs int64  `json:"retryAfterMs"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &refusal), "%s", body)
		assert.Equal(t, "UNAVAILABLE", refusal.Error.Code)
		assert.Contains(t, refusal.Error.Message, "openPerNode")
		assert.EqualValues(t, 5000, refusal.Error.RetryAfterMs)
		assert.Equal(t, "5", resp.Header.Get("Retry-After"))

		// a stays busy; b, idle for 4 s, is closed with its bytes counted.
		stop := make(chan struct{})
		go func() {
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_ = a.ws.Write(ctx, websocket.MessageBinary, append([]byte{tunnel.FrameStdin}, "."...))
				}
			}
		}()
		status, reason, took := b.closed(10 * time.Second)
		close(stop)
		t.Logf("the idle tunnel closed after %s more", took)
		assert.Equal(t, websocket.StatusNormalClosure, status)
		assert.Equal(t, "idle", reason)
		e := tunnelClosed(t, f, b.id)
		assert.Equal(t, closedEvent{Reason: "idle", BytesIn: 5, BytesOut: 5, DurationMs: e.DurationMs}, e)
		assert.GreaterOrEqual(t, e.DurationMs, int64(4000))
		// The bound is of open tunnels: b's place is free again.
		c := openCat(t, f.C, id)
		require.NoError(t, c.ws.Close(websocket.StatusNormalClosure, ""))
		require.NoError(t, a.ws.Close(websocket.StatusNormalClosure, ""))
	})

}

// TestTunnelsAcrossRestarts runs on a fleet of its own with no idle
// timeout (the default, an hour): a tunnel waiting on a slow TCG guest
// across a restart must end for the restart's reason, never for idleness.
func TestTunnelsAcrossRestarts(t *testing.T) {
	f, agent, id := tunnelFleet(t, "{openPerNode: 2, tunnelsPerMinute: 60}")
	ctx := t.Context()

	t.Run("a restarted daemon's tunnels end and reopen", func(t *testing.T) {
		// computectl port-forward to a server in the sandbox (busybox
		// httpd on the guest's loopback), before and across the restart.
		r, err := f.C.SandboxesExec(ctx, &client.SandboxesExecInput{TenantId: fleettest.Tenant, SandboxId: id, Argv: []string{"sh", "-c",
			"mkdir -p /www && echo hello through the restart > /www/index.html && busybox httpd -p 127.0.0.1:8080 -h /www"}})
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Data.ExitCode, r.Data.Stderr)
		pf := exec.Command(proctest.Build(t, "computeplane/cmd/computectl"), "port-forward", id, "0:8080")
		pf.Env = proctest.ChildEnv(map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant,
			cli.EnvConfig: filepath.Join(t.TempDir(), "none.json")})
		var pfOut, pfErr output
		pf.Stdout, pf.Stderr = &pfOut, &pfErr
		require.NoError(t, pf.Start())
		t.Cleanup(func() { _ = pf.Process.Kill() })
		pfOut.await(t, 0, " -> 8080\n")
		local := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 8080`).FindStringSubmatch(pfOut.String())
		require.NotNil(t, local, pfOut.String())
		hc := &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		get := func() {
			t.Helper()
			resp, err := hc.Get("http://" + local[1] + "/index.html")
			require.NoError(t, err, "port-forward's stderr: %s", pfErr.String())
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "hello through the restart\n", string(body), "port-forward's stderr: %s", pfErr.String())
		}
		get()

		cat := openCat(t, f.C, id)
		agent.Stop()
		status, reason, _ := cat.closed(15 * time.Second)
		assert.Equal(t, websocket.StatusGoingAway, status, reason)
		assert.Equal(t, "node", tunnelClosed(t, f, cat.id).Reason)
		agent.Run()
		// At once, the daemon not back yet: port-forward's tunnel is
		// refused UNAVAILABLE with retryAfterMs and opened again by
		// itself once the daemon is back; the same local port serves.
		get()
		assert.Contains(t, pfErr.String(), "trying again")
		require.NoError(t, pf.Process.Signal(syscall.SIGINT))
		require.NoError(t, pf.Wait(), pfErr.String())
		require.Eventually(t, func() bool { return f.NodeState(agent.Node) == "ready" }, 60*time.Second, 50*time.Millisecond)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			tk, err := f.C.TunnelsOpen(ctx, &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec,
				Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}, Argv: []string{"true"}})
			if !assert.NoError(c, err) {
				return
			}
			ws, _, err := websocket.Dial(ctx, tk.Data.URL, nil)
			if !assert.NoError(c, err) {
				return
			}
			ws.CloseNow()
		}, 60*time.Second, time.Second, "the client opens a tunnel again once the daemon is back")
		openCat(t, f.C, id).echo("again\n")
	})

	t.Run("computed stopped with SIGTERM closes its tunnels, the client reopens", func(t *testing.T) {
		cat := openCat(t, f.C, id)
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			f.RestartComputed()
		}()
		// The gateway drains first (its daemon leaves, reason node) and
		// the relays close after the listener (shutdown): whichever came
		// first, a going-away close the client may reopen after, and the
		// end recorded before the process left.
		status, reason, _ := cat.closed(60 * time.Second)
		assert.Equal(t, websocket.StatusGoingAway, status)
		assert.Contains(t, []string{"node", "shutdown"}, reason)
		<-stopped
		assert.Equal(t, reason, tunnelClosed(t, f, cat.id).Reason)
		require.Eventually(t, func() bool { return f.NodeState(agent.Node) == "ready" }, 90*time.Second, 100*time.Millisecond)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			tk, err := f.C.TunnelsOpen(ctx, &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec,
				Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}, Argv: []string{"cat"}})
			if !assert.NoError(c, err) {
				return
			}
			// A daemon whose session is still settling answers 503: the
			// client retries, as it does on any UNAVAILABLE.
			ws, _, err := websocket.Dial(ctx, tk.Data.URL, nil)
			if !assert.NoError(c, err) {
				return
			}
			defer ws.CloseNow()
			(&catTunnel{t: t, id: tk.Data.Tunnel.TunnelId, ws: ws}).echo("back\n")
		}, 90*time.Second, time.Second, "the client opens a tunnel again through the new process")
	})
}
