package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/drivers"
	"computeplane/internal/images"
	"computeplane/internal/outbox"
)

// Env is what an action sees: the node, its driver (opened on first use)
// and the job's store and image source.
type Env struct {
	Job        *Job
	WorkflowID string
	NodeID     string
	TenantID   string
	Step       string
	Attempt    int
	Inputs     map[string]any
	Images     images.Source
	Log        *slog.Logger

	driver drivers.Driver
	fence  fenceFunc
}

// Action is a built-in action: idempotent, bounded by ctx (the step's
// timeout), returning its output.
type Action func(ctx context.Context, env *Env, with map[string]any) (map[string]any, error)

// Actions are the built-in actions steps use, by name.
var Actions = map[string]Action{
	"power.on":       powerAction(drivers.ActionOn),
	"power.off":      powerAction(drivers.ActionOff),
	"power.reset":    powerAction(drivers.ActionReset),
	"boot.set":       bootSet,
	"media.insert":   mediaInsert,
	"media.eject":    mediaEject,
	"agent.wait":     agentWait,
	"image.write":    imageWrite,
	"host.configure": hostConfigure,
	"inventory":      inventory,
	"console.read":   consoleRead,
	"node.join":      nodeJoin,
}

// Driver opens the node's bare-metal driver.
func (e *Env) Driver(ctx context.Context) (drivers.Driver, error) {
	if e.driver != nil {
		return e.driver, nil
	}
	mh, err := e.Job.Store.Queries().GetMetalHost(ctx, e.NodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("node %s has no bare-metal driver", e.NodeID)
	}
	if err != nil {
		return nil, err
	}
	d, err := e.Job.Drivers.Open(ctx, mh.Driver, mh.Config)
	if err != nil {
		return nil, err
	}
	e.driver = d
	return d, nil
}

func (e *Env) close() {
	if e.driver != nil {
		_ = e.driver.Close()
	}
}

func str(with map[string]any, key string, required bool) (string, error) {
	v, ok := with[key]
	if !ok || v == nil {
		if required {
			return "", fmt.Errorf("with.%s is required", key)
		}
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("with.%s is a string", key)
	}
	return s, nil
}

func powerAction(action string) Action {
	return func(ctx context.Context, env *Env, _ map[string]any) (map[string]any, error) {
		d, err := env.Driver(ctx)
		if err != nil {
			return nil, err
		}
		if err := d.Power(ctx, action); err != nil {
			return nil, err
		}
		st, err := d.PowerState(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]any{"powerState": st}, nil
	}
}

func bootSet(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	dev, err := str(with, "device", true)
	if err != nil {
		return nil, err
	}
	once, _ := with["once"].(bool)
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]any{"device": dev, "once": once}, d.SetBootDevice(ctx, dev, once)
}

// media resolves an image id through the image source.
func (e *Env) media(ctx context.Context, slot, id string) (drivers.Media, *images.Image, error) {
	if e.Images == nil {
		return drivers.Media{}, nil, errors.New("no image source is configured")
	}
	im, err := e.Images.Get(ctx, id)
	if err != nil {
		return drivers.Media{}, nil, fmt.Errorf("image %s: %w", id, err)
	}
	return drivers.Media{Slot: slot, ImageID: im.ID, Format: im.Format, URL: im.Location, Initrd: im.Initrd, Cmdline: im.Cmdline,
		SizeBytes: im.SizeBytes, SHA256: im.SHA256}, im, nil
}

func mediaInsert(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	slot, err := str(with, "slot", true)
	if err != nil {
		return nil, err
	}
	id, err := str(with, "image", true)
	if err != nil {
		return nil, err
	}
	m, _, err := env.media(ctx, slot, id)
	if err != nil {
		return nil, err
	}
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]any{"slot": slot, "image": id, "format": m.Format}, d.InsertMedia(ctx, m)
}

func mediaEject(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	slot, err := str(with, "slot", true)
	if err != nil {
		return nil, err
	}
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]any{"slot": slot}, d.EjectMedia(ctx, slot)
}

// agent waits for the host's agent to answer.
func (e *Env) agent(ctx context.Context) (drivers.Agent, *drivers.AgentStatus, error) {
	d, err := e.Driver(ctx)
	if err != nil {
		return nil, nil, err
	}
	var last error
	for {
		a, err := d.Agent(ctx)
		if errors.Is(err, drivers.ErrUnsupported) {
			return nil, nil, err
		}
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, serr := a.Status(cctx)
			cancel()
			if serr == nil {
				return a, st, nil
			}
			a.Close()
			err = serr
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("the host's agent did not answer: %w%s", last, consoleTail(d))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// consoleTail is the end of the host's serial console for an error
// message, where the driver reads it.
func consoleTail(d drivers.Driver) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := d.Console(ctx, 512)
	if err != nil || len(b) == 0 {
		return ""
	}
	return "; console: " + strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
}

// agentWait waits until the agent answers from the system booted from
// with.boot (cd: the in-memory agent; disk: the installed system), and,
// with hostname, until that system carries the configured hostname.
func agentWait(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	boot, err := str(with, "boot", false)
	if err != nil {
		return nil, err
	}
	hostname, err := str(with, "hostname", false)
	if err != nil {
		return nil, err
	}
	// Until the deadline: a host being reset may still answer from the
	// system it is leaving.
	for {
		out, err := agentCheck(ctx, env, boot, hostname)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func agentCheck(ctx context.Context, env *Env, boot, hostname string) (map[string]any, error) {
	a, st, err := env.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	if boot != "" && !strings.Contains(" "+st.Cmdline+" ", " compute.boot="+boot+" ") {
		return nil, fmt.Errorf("the host booted %q, not from %s", st.Cmdline, boot)
	}
	out := map[string]any{"bootId": st.BootID, "kernel": st.Kernel, "uptimeMs": st.UptimeMs, "cmdline": st.Cmdline}
	if hostname != "" {
		r, err := a.Exec(ctx, []string{"sh", "-c", "mkdir -p /mnt/system && (mountpoint -q /mnt/system || mount -o ro " + diskDev + " /mnt/system) && cat /mnt/system/etc/hostname"}, 30*time.Second)
		if err != nil {
			return nil, err
		}
		if r.ExitCode != 0 {
			return nil, fmt.Errorf("reading the installed hostname: %s", strings.TrimSpace(r.Stderr))
		}
		if got := strings.TrimSpace(r.Stdout); got != hostname {
			return nil, fmt.Errorf("the installed system is %q, not %q", got, hostname)
		}
		out["hostname"] = hostname
	}
	return out, nil
}

// The in-memory agent names disks by serial (/dev/disk/by-id/virtio-*):
// the host's disk and the virtual media holding the image.
const (
	diskDev  = "/dev/disk/by-id/virtio-disk0"
	mediaDev = "/dev/disk/by-id/virtio-vmedia-"
)

func sh(ctx context.Context, a drivers.Agent, script string, timeout time.Duration) (string, error) {
	r, err := a.Exec(ctx, []string{"sh", "-c", script}, timeout)
	if err != nil {
		return "", err
	}
	if r.TimedOut {
		return "", fmt.Errorf("%q timed out on the host", script)
	}
	if r.ExitCode != 0 {
		return "", fmt.Errorf("%q exited %d: %s", script, r.ExitCode, strings.TrimSpace(r.Stderr))
	}
	return r.Stdout, nil
}

func remaining(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl)-time.Second, time.Second)
	}
	return 5 * time.Minute
}

// imageWrite copies the image from the virtual media slot with.source to
// the host's disk through the agent, then checks the disk against the
// image's size and sha256 (caches dropped first, so a rewritten medium
// is read again). It writes the whole image every time: idempotent.
func imageWrite(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	id, err := str(with, "image", true)
	if err != nil {
		return nil, err
	}
	source, err := str(with, "source", false)
	if err != nil {
		return nil, err
	}
	if source == "" {
		source = drivers.SlotUSB
	}
	_, im, err := env.media(ctx, source, id)
	if err != nil {
		return nil, err
	}
	if im.Format != "raw" {
		return nil, fmt.Errorf("image %s is %s; image.write writes raw images", id, im.Format)
	}
	a, _, err := env.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	blocks := (im.SizeBytes + (1 << 20) - 1) >> 20
	start := time.Now()
	if _, err := sh(ctx, a, fmt.Sprintf("umount /mnt/system 2>/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches; dd if=%s%s of=%s bs=1M count=%d conv=fsync 2>&1",
		mediaDev, source, diskDev, blocks), remaining(ctx)); err != nil {
		return nil, err
	}
	wrote := time.Since(start)
	start = time.Now()
	sum, err := sh(ctx, a, fmt.Sprintf("echo 3 > /proc/sys/vm/drop_caches; head -c %d %s | sha256sum", im.SizeBytes, diskDev), remaining(ctx))
	if err != nil {
		return nil, err
	}
	got, _, _ := strings.Cut(strings.TrimSpace(sum), " ")
	if im.SHA256 != "" && got != im.SHA256 {
		return nil, fmt.Errorf("the disk holds sha256 %s after the write, the image is %s", got, im.SHA256)
	}
	return map[string]any{"image": id, "bytes": im.SizeBytes, "sha256": got, "writeMs": wrote.Milliseconds(),
		"verifyMs": time.Since(start).Milliseconds()}, nil
}

// hostConfigure mounts the written system and writes its configuration:
// the hostname and the node's identity (/etc/computeplane/node.json).
func hostConfigure(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	hostname, err := str(with, "hostname", true)
	if err != nil {
		return nil, err
	}
	a, _, err := env.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	if _, err := sh(ctx, a, "mkdir -p /mnt/system && (mountpoint -q /mnt/system || mount "+diskDev+" /mnt/system) && mkdir -p /mnt/system/etc/computeplane", 30*time.Second); err != nil {
		return nil, err
	}
	ident, _ := json.Marshal(map[string]string{"nodeId": env.NodeID, "workflowId": env.WorkflowID, "hostname": hostname})
	if err := a.WriteFile(ctx, "/mnt/system/etc/hostname", []byte(hostname+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := a.WriteFile(ctx, "/mnt/system/etc/computeplane/node.json", ident, 0o644); err != nil {
		return nil, err
	}
	if _, err := sh(ctx, a, "sync && umount /mnt/system", 30*time.Second); err != nil {
		return nil, err
	}
	return map[string]any{"hostname": hostname}, nil
}

// consoleRead keeps the tail of the host's serial console as the step's
// output (at most with.bytes, default and cap 16 KiB).
func consoleRead(ctx context.Context, env *Env, with map[string]any) (map[string]any, error) {
	n := 16 << 10
	if v, ok := with["bytes"].(float64); ok && v > 0 && int(v) < n {
		n = int(v)
	}
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	b, err := d.Console(ctx, n)
	if err != nil {
		return nil, err
	}
	return map[string]any{"console": strings.ToValidUTF8(string(b), "?")}, nil
}

func inventory(ctx context.Context, env *Env, _ map[string]any) (map[string]any, error) {
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	inv, err := d.Inventory(ctx)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	b, _ := json.Marshal(inv)
	_ = json.Unmarshal(b, &out)
	return out, nil
}

// nodeJoin makes the node ready in its pool with the capacity its driver
// inventories (a joining node; a node already past joining is left as it
// is) and publishes node.registered, as a daemon's first session does.
func nodeJoin(ctx context.Context, env *Env, _ map[string]any) (map[string]any, error) {
	d, err := env.Driver(ctx)
	if err != nil {
		return nil, err
	}
	inv, err := d.Inventory(ctx)
	if err != nil {
		return nil, err
	}
	var disk int64
	for _, dk := range inv.Disks {
		disk += dk.SizeBytes
	}
	out := map[string]any{"vcpu": inv.VCPU, "memoryMiB": inv.MemoryMiB, "diskGiB": disk >> 30, "serialNumber": inv.SerialNumber}
	err = env.Job.tx(ctx, env.fence, func(ctx context.Context, tx pgx.Tx, q *db.Queries) error {
		n, err := q.LockWorkflowNode(ctx, env.NodeID)
		if err != nil {
			return err
		}
		out["state"] = n.State
		if n.State != "joining" {
			return nil
		}
		if err := q.JoinMetalNode(ctx, db.JoinMetalNodeParams{NodeID: env.NodeID, CapVcpu: int32(inv.VCPU), CapMemoryMib: inv.MemoryMiB,
			CapDiskGib: disk >> 30}); err != nil {
			return err
		}
		out["state"] = "ready"
		return outbox.Write(ctx, tx, outbox.Event{Type: api.EventNodeRegistered, Subject: env.NodeID, TenantID: n.TenantID,
			Data: api.NodeRegisteredPayload{NodeID: env.NodeID, PoolID: n.PoolID, Hostname: n.Hostname, State: "ready"}})
	})
	return out, err
}
