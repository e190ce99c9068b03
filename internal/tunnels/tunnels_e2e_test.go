package tunnels_test

// An exec tunnel end to end through real processes: computed (api and
// gateway with its internal API), a compute-agent with the qemu runtime
// and a sandbox that is a real VM (TCG) whose guest agent runs the program.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

func TestExecTunnelIntoASandbox(t *testing.T) {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.Tunnels())
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 60), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool, Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Flavor: "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1", Wait: client.NewOptWait(client.Wait{TimeoutMs: 30000})})
	require.NoError(t, err)
	id := sbx.Data.SandboxId
	require.Eventually(t, func() bool {
		g, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: id})
		require.NoError(t, err)
		return g.Data.State == "running"
	}, 60*time.Second, 100*time.Millisecond)

	open := func() (*client.TunnelsOpenResult, error) {
		return f.C.TunnelsOpen(ctx, &client.TunnelsOpenInput{TenantId: fleettest.Tenant, Kind: client.TunnelsOpenInputKindExec,
			Target: client.TunnelTarget{Kind: client.TunnelTargetKindSandbox, ID: id}, Argv: []string{"sh", "-c", "read x; echo got $x; echo to-err >&2; exit 7"}})
	}
	tk, err := open()
	require.NoError(t, err)
	assert.Equal(t, "issued", string(tk.Data.Tunnel.State))
	assert.True(t, strings.HasPrefix(tk.Data.URL, "ws://127.0.0.1:"), tk.Data.URL)

	// The program reads its stdin, writes both outputs and exits 7.
	start := time.Now()
	ws, _, err := websocket.Dial(ctx, tk.Data.URL, nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, append([]byte{tunnel.FrameStdin}, "hello\n"...)))
	var stdout, stderr strings.Builder
	var exit tunnel.Exit
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for done := false; !done; {
		_, b, err := ws.Read(rctx)
		require.NoError(t, err)
		require.NotEmpty(t, b)
		switch b[0] {
		case tunnel.FrameStdout:
			stdout.Write(b[1:])
		case tunnel.FrameStderr:
			stderr.Write(b[1:])
		case tunnel.FrameExit:
			require.NoError(t, json.Unmarshal(b[1:], &exit))
			done = true
		}
	}
	t.Logf("tunnel round trip (open, program, exit): %v", time.Since(start))
	assert.Equal(t, "got hello\n", stdout.String())
	assert.Equal(t, "to-err\n", stderr.String())
	assert.Equal(t, tunnel.Exit{ExitCode: 7}, exit)
	_, _, err = ws.Read(rctx)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "the api closes the tunnel after the exit")

	// Its end is recorded: state, bytes, exit code, events.
	require.Eventually(t, func() bool {
		l, err := f.C.TunnelsList(ctx, &client.TunnelsListInput{TenantId: fleettest.Tenant, IncludeClosed: client.NewOptBool(true)})
		require.NoError(t, err)
		return len(l.Data.Items) == 1 && l.Data.Items[0].State == "closed"
	}, 10*time.Second, 50*time.Millisecond)
	l, err := f.C.TunnelsList(ctx, &client.TunnelsListInput{TenantId: fleettest.Tenant, IncludeClosed: client.NewOptBool(true)})
	require.NoError(t, err)
	got := l.Data.Items[0]
	assert.Equal(t, int64(6), got.BytesIn)
	assert.Equal(t, int64(len("got hello\nto-err\n")), got.BytesOut)
	assert.Equal(t, client.NewNilInt64(7), got.ExitCode)
	assert.Equal(t, 1, f.Events("tunnel.opened", got.TunnelId))
	assert.Equal(t, 1, f.Events("tunnel.closed", got.TunnelId))
	l, err = f.C.TunnelsList(ctx, &client.TunnelsListInput{TenantId: fleettest.Tenant})
	require.NoError(t, err)
	assert.Empty(t, l.Data.Items, "closed tunnels only when asked")

	// A ticket opens once.
	_, resp, err := websocket.Dial(ctx, tk.Data.URL, nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// From another source address a ticket is refused and stays its
	// owner's; an unknown ticket is refused (one statement decides all).
	tk3, err := open()
	require.NoError(t, err)
	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	_, resp, err = websocket.Dial(ctx, tk3.Data.URL, &websocket.DialOptions{HTTPClient: other})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	_, resp, err = websocket.Dial(ctx, tk3.Data.URL[:strings.LastIndexByte(tk3.Data.URL, '/')+1]+"unknown", nil)
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	ws3, _, err := websocket.Dial(ctx, tk3.Data.URL, nil)
	require.NoError(t, err, "the owner's address still redeems it")
	ws3.CloseNow()

	// A ticket closed before its use is void.
	tk2, err := open()
	require.NoError(t, err)
	closed, err := f.C.TunnelsClose(ctx, &client.TunnelsCloseInput{TenantId: fleettest.Tenant, TunnelId: tk2.Data.Tunnel.TunnelId})
	require.NoError(t, err)
	assert.Equal(t, "closed", string(closed.Data.State))
	_, resp, err = websocket.Dial(ctx, tk2.Data.URL, nil)
	require.Error(t, err)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// Ten tunnels a minute per identity: three were opened, seven more
	// pass, the eleventh is RATE_LIMITED with a hint.
	for i := 0; i < 7; i++ {
		_, err := open()
		require.NoError(t, err, "tunnel %d", i+4)
	}
	_, err = open()
	e, ok := computeclient.AsError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "RATE_LIMITED", e.Code)
	require.NotNil(t, e.RetryAfterMs)
	assert.Greater(t, *e.RetryAfterMs, int64(0))
	assert.LessOrEqual(t, *e.RetryAfterMs, int64(60000))
}
