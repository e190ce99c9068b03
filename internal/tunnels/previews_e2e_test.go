package tunnels_test

// Background processes and preview URLs end to end through real processes
// (computed with api and gateway, compute-agent with the qemu runtime),
// computectl as a user runs it, and one sandbox that is a real VM (TCG):
// a busybox httpd started as a background process, reached through
// port-forward and a preview URL (private, then public; path- and
// host-based), an Upgrade passing through, then signalled and waited for.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/cli"
	"computeplane/internal/fleettest"
	"computeplane/internal/proctest"
	"computeplane/internal/qemu/qemutest"
)

func TestSandboxProcessesAndPreviews(t *testing.T) {
	im := qemutest.Image(t)
	f := fleettest.Start(t, fmt.Sprintf("images: {dir: %q}\n", filepath.Dir(filepath.Dir(im.Location))), fleettest.PreviewDomain("preview.test"))
	pool := f.Pool(client.PoolsCreateInputClassVpsHost, "small", 1, 256)
	agent := f.Join(pool, "--runtime", "qemu", "--accel", "tcg", "--vcpu", "8", "--memory-mib", "4096", "--disk-gib", "1000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("computed:\n%s\nagent:\n%s", proctest.Tail(f.Computed.Stderr.String(), 60), proctest.Tail(agent.Proc.Stderr.String(), 60))
		}
	})
	ctx := t.Context()
	computectl := proctest.Build(t, "computeplane/cmd/computectl")
	env := map[string]string{cli.EnvURL: f.PublicURL, cli.EnvToken: f.Key, cli.EnvTenant: fleettest.Tenant}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(computectl, args...)
		cmd.Env = proctest.ChildEnv(env)
		return cmd
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := command(args...).Output()
		var ee *exec.ExitError
		if assertAs(err, &ee) {
			t.Fatalf("computectl %v: %v: %s", args, err, ee.Stderr)
		}
		require.NoError(t, err)
		return string(out)
	}

	// One sandbox shared by the cases.
	tpl, err := f.C.SandboxTemplatesCreate(ctx, &client.SandboxTemplatesCreateInput{TenantId: fleettest.Tenant, Name: "t1", PoolId: pool,
		Network: client.NewOptSandboxTemplatesCreateInputNetwork(client.SandboxTemplatesCreateInputNetworkNone),
		Flavor:  "small", ImageId: "computeplane/minimal"})
	require.NoError(t, err)
	sbx, err := f.C.SandboxesCreate(ctx, &client.SandboxesCreateInput{TenantId: fleettest.Tenant, TemplateId: client.NewOptString(tpl.Data.TemplateId),
		IdempotencyKey: "s1"})
	require.NoError(t, err)
	sandbox := sbx.Data.SandboxId
	require.Eventually(t, func() bool {
		s, err := f.C.SandboxesGet(ctx, &client.SandboxesGetInput{TenantId: fleettest.Tenant, SandboxId: sandbox})
		require.NoError(t, err)
		return s.Data.State == "running"
	}, 120*time.Second, 200*time.Millisecond)

	t.Run("a background process: env, dir, output, stdin, exit code", func(t *testing.T) {
		p, err := f.C.SandboxesStartProcess(ctx, &client.SandboxesStartProcessInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
			Argv: []string{"sh", "-c", `echo "up $GREETING in $(pwd)"; echo to-err >&2; while read l; do echo "got $l"; done; exit 5`},
			Env:  client.NewOptSandboxesStartProcessInputEnv(client.SandboxesStartProcessInputEnv{"GREETING": "hi"}), Dir: client.NewOptString("/tmp")})
		require.NoError(t, err)
		pid := p.Data.Pid
		assert.True(t, p.Data.Running)

		// The call returned; the process runs on. Its output by offset,
		// waited for (a long poll).
		var stdout, stderr string
		next := int64(0)
		follow := func(want string) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(stdout, want) && time.Now().Before(deadline) {
				o, err := f.C.SandboxesReadProcessOutput(ctx, &client.SandboxesReadProcessOutputInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
					Pid: pid, Offset: client.NewOptInt64(next), WaitMs: client.NewOptInt64(5000)})
				require.NoError(t, err)
				for _, c := range o.Data.Chunks {
					if c.Stream == client.SandboxOutputChunkStreamStdout {
						stdout += c.Data
					} else {
						stderr += c.Data
					}
				}
				next = o.Data.NextOffset
			}
			require.Contains(t, stdout, want)
		}
		follow("up hi in /tmp\n")
		_, err = f.C.SandboxesWriteProcessStdin(ctx, &client.SandboxesWriteProcessStdinInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
			Pid: pid, Data: client.NewOptString("one\n")})
		require.NoError(t, err)
		follow("got one\n")

		// A bounded wait answers it running.
		w, err := f.C.SandboxesWaitProcess(ctx, &client.SandboxesWaitProcessInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Pid: pid,
			TimeoutMs: client.NewOptInt64(200)})
		require.NoError(t, err)
		assert.True(t, w.Data.Running)

		// The end of stdin ends it: exit code 5.
		_, err = f.C.SandboxesWriteProcessStdin(ctx, &client.SandboxesWriteProcessStdinInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
			Pid: pid, EOF: client.NewOptBool(true)})
		require.NoError(t, err)
		w, err = f.C.SandboxesWaitProcess(ctx, &client.SandboxesWaitProcessInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Pid: pid,
			TimeoutMs: client.NewOptInt64(20000)})
		require.NoError(t, err)
		require.False(t, w.Data.Running)
		assert.Equal(t, client.NewNilInt64(5), w.Data.ExitCode)
		o, err := f.C.SandboxesReadProcessOutput(ctx, &client.SandboxesReadProcessOutputInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Pid: pid})
		require.NoError(t, err)
		assert.True(t, o.Data.Exited)
		assert.Contains(t, fmt.Sprint(o.Data.Chunks), "to-err")

		// Refusals: stdin of an exited process, an unknown pid.
		_, err = f.C.SandboxesWriteProcessStdin(ctx, &client.SandboxesWriteProcessStdinInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
			Pid: pid, Data: client.NewOptString("x")})
		e, ok := computeclient.AsError(err)
		require.True(t, ok, "%v", err)
		assert.Equal(t, "INVALID_STATE", e.Code)
		_, err = f.C.SandboxesWaitProcess(ctx, &client.SandboxesWaitProcessInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Pid: 4000000})
		e, ok = computeclient.AsError(err)
		require.True(t, ok, "%v", err)
		assert.Equal(t, "NOT_FOUND", e.Code)
	})

	t.Run("a background server: port-forward, preview URLs, an upgrade, signal and wait", func(t *testing.T) {
		// The site and an upgrading server (nc runs the script per
		// connection: it answers 101, then echoes).
		r, err := f.C.SandboxesExec(ctx, &client.SandboxesExecInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Argv: []string{"sh", "-c",
			`mkdir -p /www && echo hello from the sandbox > /www/index.html && printf '%s\n' '#!/bin/sh' ` +
				`'while read -r l; do l=$(printf %s "$l" | tr -d "\r"); [ -z "$l" ] && break; done' ` +
				`'printf "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"' 'exec cat' > /up.sh && chmod +x /up.sh`}})
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Data.ExitCode, r.Data.Stderr)

		// httpd in the foreground (-f) as a background process, started
		// by computectl: it outlives the call.
		var started struct{ Pid int64 }
		require.NoError(t, json.Unmarshal([]byte(run("sandboxes", "startProcess", "--sandbox-id", sandbox, "--output", "json", "--",
			"busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www")), &started))
		require.NotZero(t, started.Pid)
		t.Cleanup(func() {
			if t.Failed() {
				o, err := f.C.SandboxesReadProcessOutput(ctx, &client.SandboxesReadProcessOutputInput{TenantId: fleettest.Tenant, SandboxId: sandbox, Pid: started.Pid})
				if err == nil {
					t.Logf("httpd: %+v", o.Data)
				}
			}
		})
		up, err := f.C.SandboxesStartProcess(ctx, &client.SandboxesStartProcessInput{TenantId: fleettest.Tenant, SandboxId: sandbox,
			Argv: []string{"busybox", "nc", "-ll", "-p", "9001", "-e", "/up.sh"}})
		require.NoError(t, err)

		var listed struct {
			Items []struct {
				Pid     int64
				Running bool
				Argv    []string
			}
		}
		require.NoError(t, json.Unmarshal([]byte(run("sandboxes", "listProcesses", "--sandbox-id", sandbox, "--output", "json")), &listed))
		running := map[int64]bool{}
		for _, p := range listed.Items {
			running[p.Pid] = p.Running
		}
		assert.True(t, running[started.Pid], "httpd listed running: %+v", listed)
		assert.True(t, running[up.Data.Pid], "nc listed running: %+v", listed)

		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		get := func(u string, header map[string]string) (*http.Response, string) {
			t.Helper()
			var resp *http.Response
			// The server may take a moment to listen.
			require.Eventually(t, func() bool {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
				for k, v := range header {
					if k == "Host" {
						req.Host = v
					} else {
						req.Header.Set(k, v)
					}
				}
				var err error
				resp, err = hc.Do(req)
				if err != nil {
					t.Logf("GET %s: %v", u, err)
					return false
				}
				if resp.StatusCode == http.StatusServiceUnavailable {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					t.Logf("GET %s: %s", u, b)
					return false
				}
				return true
			}, 30*time.Second, 200*time.Millisecond)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp, string(body)
		}

		// port-forward reaches it.
		cmd := command("port-forward", sandbox, "0:8080")
		var out, errOut output
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		out.await(t, 0, " -> 8080\n")
		local := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 8080`).FindStringSubmatch(out.String())
		require.NotNil(t, local, out.String())
		resp, body := get("http://"+local[1]+"/index.html", nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello from the sandbox\n", body)
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		require.NoError(t, cmd.Wait(), errOut.String())

		// A preview URL: private, with its token in the query.
		withToken := strings.TrimSpace(run("preview", sandbox, "8080"))
		u, err := url.Parse(withToken)
		require.NoError(t, err)
		token := u.Query().Get("token")
		require.NotEmpty(t, token, withToken)
		base := strings.TrimSuffix(withToken, "?token="+token)
		assert.True(t, strings.HasPrefix(base, f.PublicURL+"/") && strings.HasSuffix(base, "/previews/"+sandbox+"/8080/"), base)

		resp, _ = get(base+"index.html", nil)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "private: no token")
		resp, _ = get(base+"index.html?token=wrong", nil)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "private: a wrong token")
		resp, body = get(base+"index.html?token="+token, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello from the sandbox\n", body)
		var cookie *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == "compute_preview_token" {
				cookie = c
			}
		}
		require.NotNil(t, cookie, "the first hit with ?token= sets the cookie")
		assert.Equal(t, strings.TrimPrefix(base, f.PublicURL), cookie.Path)
		assert.True(t, cookie.HttpOnly)
		resp, body = get(base+"index.html", map[string]string{"Cookie": cookie.Name + "=" + cookie.Value})
		assert.Equal(t, http.StatusOK, resp.StatusCode, "the cookie is the token")
		assert.Equal(t, "hello from the sandbox\n", body)
		resp, _ = get(base+"index.html", map[string]string{"X-Preview-Token": token})
		assert.Equal(t, http.StatusOK, resp.StatusCode, "the header is the token")
		resp, _ = get(base+"nothing-here", map[string]string{"X-Preview-Token": token})
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the guest's own 404")

		// Host-based: <port>-sbx-<body>.preview.test (sent to the api's
		// address with that Host).
		hostURL := strings.TrimSpace(run("preview", "--host", sandbox, "8080"))
		hu, err := url.Parse(hostURL)
		require.NoError(t, err)
		assert.Equal(t, "8080-"+strings.Replace(sandbox, "_", "-", 1)+".preview.test", hu.Hostname())
		resp, _ = get(f.PublicURL+"/index.html", map[string]string{"Host": hu.Host})
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		resp, body = get(f.PublicURL+"/index.html", map[string]string{"Host": hu.Host, "X-Preview-Token": token})
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello from the sandbox\n", body)

		// Public: no token needed; the URL printed has none.
		public := strings.TrimSpace(run("preview", "--public", sandbox, "8080"))
		assert.Equal(t, base, public)
		resp, body = get(base+"index.html", nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello from the sandbox\n", body)
		l, err := f.C.TunnelsListPreviews(ctx, &client.TunnelsListPreviewsInput{TenantId: fleettest.Tenant})
		require.NoError(t, err)
		require.Len(t, l.Data.Items, 1)
		assert.True(t, l.Data.Items[0].Public)
		assert.Equal(t, token, l.Data.Items[0].Token, "the token stays the same")

		// An Upgrade passes through a preview both ways.
		wsURL := strings.TrimSpace(run("preview", sandbox, "9001"))
		wu, err := url.Parse(wsURL)
		require.NoError(t, err)
		var conn net.Conn
		var br *bufio.Reader
		require.Eventually(t, func() bool {
			conn, err = net.DialTimeout("tcp", wu.Host, 5*time.Second)
			require.NoError(t, err)
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "GET %s?%s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", wu.Path, wu.RawQuery, wu.Host)
			br = bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			if resp.StatusCode != http.StatusSwitchingProtocols {
				conn.Close()
				return false
			}
			return true
		}, 30*time.Second, 300*time.Millisecond)
		defer conn.Close()
		_, err = conn.Write([]byte("ping over the upgrade\n"))
		require.NoError(t, err)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "ping over the upgrade\n", line)

		// Signalled and waited for, through computectl: 128+15.
		run("sandboxes", "signalProcess", "--sandbox-id", sandbox, "--pid", fmt.Sprint(started.Pid), "--signal", "TERM")
		var waited struct {
			Running  bool
			ExitCode *int
		}
		require.NoError(t, json.Unmarshal([]byte(run("sandboxes", "waitProcess", "--sandbox-id", sandbox, "--pid", fmt.Sprint(started.Pid),
			"--timeout-ms", "20000", "--output", "json")), &waited))
		assert.False(t, waited.Running)
		require.NotNil(t, waited.ExitCode)
		assert.Equal(t, 128+15, *waited.ExitCode)
		resp, err = hc.Get(base + "index.html")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "nothing listens any more")
	})
}

func assertAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}
