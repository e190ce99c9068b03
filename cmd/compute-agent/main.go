// Command compute-agent is the node daemon: `compute-agent join` makes the
// node's key and joins a pool with a single-use token; `compute-agent run`
// holds a session with a gateway of the region and runs the node's desired
// spec. See docs/agent-install.md and internal/agent.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"computeplane/internal/agent"
	"computeplane/internal/agent/egressproxy"
	"computeplane/internal/agent/network"
	"computeplane/internal/agent/telemetry"
	"computeplane/internal/agent/vmruntime"
	"computeplane/internal/agentproto"
	"computeplane/internal/buildinfo"
	"computeplane/internal/configerr"
	"computeplane/internal/qemu"
	"computeplane/internal/release"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: compute-agent join --api URL --token-file F --dir D [--hostname H] [--force] [--tpm /dev/tpmrm0|unix:SOCKET] [--cloud-metadata unix:SOCKET|URL | --cloud-identity-file F]")
	fmt.Fprintln(w, "       compute-agent tpm-ek [--tpm /dev/tpmrm0|unix:SOCKET]")
	fmt.Fprintln(w, "       compute-agent run --dir D [--runtime qemu|recording] [--accel auto|kvm|tcg] [--volumes D2] [--vcpu N] [--memory-mib N] [--disk-gib N]")
	fmt.Fprintln(w, "             [--network none|nftables [--net-uplink IF] [--net-egress-pool CIDR] [--net-private-pool CIDR] [--net-allow-private CIDRS]")
	fmt.Fprintln(w, "              [--net-deny CIDRS] [--net-resolvers ADDRS] [--net-bandwidth-mbps N] [--net-mtu N] [--net-underlay ADDR|none] [--net-vxlan-port N]]")
	fmt.Fprintln(w, "             [--telemetry-endpoint URL [--telemetry-interval 60s] [--telemetry-attribute K=V]...]")
	fmt.Fprintln(w, "       compute-agent upgrade --dir D [--version V] [--release-key F] [--restart exec|none] [--force]")
	fmt.Fprintln(w, "       compute-agent version")
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	switch args[0] {
	case "join":
		return join(ctx, args[1:], stdout, stderr)
	case "run":
		return serve(ctx, args[1:], stderr, log)
	case "upgrade":
		return upgrade(ctx, args[1:], stdout, stderr)
	case "tpm-ek":
		return tpmEK(args[1:], stdout, stderr)
	case "version":
		// The version alone first, as `computed version` and system.version
		// give it; then the protocol range.
		fmt.Fprintf(stdout, "%s\nprotocol %d-%d\n", buildinfo.Version(), agentproto.ProtocolMin, agentproto.ProtocolMax)
		return 0
	}
	usage(stderr)
	return 2
}

func join(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compute-agent join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	api := fs.String("api", "", "the control plane's public URL (https; http only to a loopback host)")
	tokenFile := fs.String("token-file", "", "a file holding the join token")
	token := fs.String("token", "", "the join token (prefer --token-file or COMPUTE_AGENT_TOKEN: arguments are visible to other users)")
	dir := fs.String("dir", "/var/lib/compute-agent", "the agent's directory")
	hostname := fs.String("hostname", "", "the node's hostname (default: this host's)")
	force := fs.Bool("force", false, "join again into a directory that already holds a node")
	tpm := fs.String("tpm", "", "attest the join with this TPM (the control plane's TPM attestor requires it): "+agent.DefaultTPM+", or unix:PATH for a software TPM's socket")
	cloudMetadata := fs.String("cloud-metadata", "", "attest the join with this machine's signed instance-identity document from the provider's metadata service (the control plane's cloud attestor requires it): unix:PATH, or an http URL to a link-local or loopback address")
	cloudIdentityFile := fs.String("cloud-identity-file", "", "attest the join with an instance-identity document read beforehand from this file")
	if fs.Parse(args) != nil {
		return 2
	}
	if *cloudMetadata != "" && *cloudIdentityFile != "" {
		fmt.Fprintln(stderr, "compute-agent join: --cloud-metadata and --cloud-identity-file exclude each other")
		return 2
	}
	tok := *token
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(stderr, "compute-agent join:", err)
			return 1
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok == "" {
		tok = os.Getenv("COMPUTE_AGENT_TOKEN")
	}
	node, err := agent.Join(ctx, agent.JoinOptions{APIURL: *api, Token: tok, Dir: agent.Dir(*dir), Hostname: *hostname, Force: *force, TPM: *tpm,
		CloudMetadata: *cloudMetadata, CloudIdentityFile: *cloudIdentityFile})
	if err != nil {
		var refused *agent.RefusedError
		if errors.As(err, &refused) {
			fmt.Fprintf(stderr, "compute-agent join: refused: %s\n", refused.Message)
		} else {
			fmt.Fprintln(stderr, "compute-agent join:", err)
		}
		return 1
	}
	fmt.Fprintln(stdout, node)
	return 0
}

// tpmEK prints the TPM's endorsement key hash: what the operator enrolls
// in tpm.endorsementKeys before the machine joins.
func tpmEK(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compute-agent tpm-ek", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tpm := fs.String("tpm", agent.DefaultTPM, "the TPM: "+agent.DefaultTPM+", or unix:PATH for a software TPM's socket")
	if fs.Parse(args) != nil {
		return 2
	}
	ek, err := agent.TPMEndorsementKey(*tpm)
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent tpm-ek:", err)
		return 1
	}
	fmt.Fprintln(stdout, ek)
	return 0
}

// upgrade installs a release of compute-agent from the control plane the
// node joined (verified against the pinned release key) over this binary,
// then has the daemon of the directory execute it.
func upgrade(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compute-agent upgrade", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "/var/lib/compute-agent", "the agent's directory (its node names the control plane)")
	version := fs.String("version", "latest", "the release to install (v1.2.3), or latest")
	keyFile := fs.String("release-key", "", "a release public key to pin besides the node's (PEM or hex), for a node joined before its control plane had one")
	restart := fs.String("restart", "exec", "exec: the running daemon executes the new binary (same pid, VMs run on); none: install only")
	force := fs.Bool("force", false, "install even when the version is the one running")
	if fs.Parse(args) != nil {
		return 2
	}
	if *restart != "exec" && *restart != "none" {
		fmt.Fprintf(stderr, "compute-agent upgrade: --restart %q: use exec or none\n", *restart)
		return 2
	}
	o := agent.UpgradeOptions{Dir: agent.Dir(*dir), Version: *version, Current: buildinfo.Version(), Force: *force}
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err == nil {
			var k []byte
			if k, err = release.ParsePublicKey(b); err == nil {
				o.ReleaseKeys = append(o.ReleaseKeys, k)
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "compute-agent upgrade: --release-key:", err)
			return 2
		}
	}
	res, err := agent.Upgrade(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent upgrade:", err)
		return 1
	}
	if !res.Installed {
		fmt.Fprintf(stdout, "compute-agent %s is the release asked for: nothing to install\n", res.To)
		return 0
	}
	fmt.Fprintf(stdout, "installed compute-agent %s over %s (%s), checksum and signature verified\n", res.To, res.From, res.Exe)
	if *restart == "none" {
		return 0
	}
	switch err := agent.Restart(ctx, agent.Dir(*dir), res.Exe, res.To); {
	case errors.Is(err, agent.ErrNoDaemon):
		fmt.Fprintln(stdout, "no daemon of this directory runs it: the next start runs the new version")
	case err != nil:
		fmt.Fprintln(stderr, "compute-agent upgrade:", err)
		return 1
	default:
		fmt.Fprintf(stdout, "the daemon runs %s\n", res.To)
	}
	return 0
}

func serve(ctx context.Context, args []string, stderr io.Writer, log *slog.Logger) int {
	fs := flag.NewFlagSet("compute-agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "/var/lib/compute-agent", "the agent's directory")
	rt := fs.String("runtime", "qemu", "the runtime behind specs: qemu (virtual machines) or recording (protocol tests)")
	accel := fs.String("accel", "auto", "qemu acceleration: auto (a probe boot decides), kvm or tcg")
	volumes := fs.String("volumes", "", "the volume store's directory (default <dir>/volumes)")
	memory := fs.String("memory-dir", "", "where guest memory files live (sandboxes); a tmpfs such as /dev/shm/compute-agent is much faster than a disk (default: each VM's directory)")
	var pool vmruntime.RestorePool
	fs.IntVar(&pool.Size, "restore-pool", 1, fmt.Sprintf("qemu processes started ahead for each snapshot restored on this node (its memory, disk and device state ready to load), taking qemu's start off a restore's path; 0 to %d, 0 keeps none (qemu runtime)", vmruntime.MaxRestorePool))
	fs.IntVar(&pool.Snapshots, "restore-pool-snapshots", 4, fmt.Sprintf("how many snapshots, the most recently restored or taken here, keep a restore pool; 1 to %d", vmruntime.MaxRestorePoolSnapshots))
	var d agent.Declared
	fs.IntVar(&d.VCPU, "vcpu", 0, "declare this many vCPUs instead of the host's")
	fs.Int64Var(&d.MemoryMiB, "memory-mib", 0, "declare this much memory instead of the host's")
	fs.Int64Var(&d.DiskGiB, "disk-gib", 0, "declare this much disk instead of the volume store's")
	nodeConsole := fs.String("node-console-command", "", "break-glass: the shell (a command and its arguments, split at spaces) that node-console tunnels run on a terminal and SSH sessions to this node run (with -c COMMAND for a command); empty: this node refuses both")
	var nf netFlags
	nf.register(fs)
	var tel telemetry.Config
	var telAttrs telemetry.List
	fs.StringVar(&tel.Endpoint, "telemetry-endpoint", "", "export host and per-VM metrics over OTLP/HTTP to this collector URL (https, or http to localhost, 127.0.0.1 or [::1]; no credentials); none when empty")
	fs.DurationVar(&tel.Interval, "telemetry-interval", telemetry.DefaultInterval, "the telemetry export interval, 5s to 3600s")
	fs.Var(&telAttrs, "telemetry-attribute", "a resource attribute key=value for the telemetry (repeatable, at most 32; values single-line, at most 256 characters)")
	if fs.Parse(args) != nil {
		return 2
	}
	// Every telemetry bound is checked before anything starts.
	tel.Attributes = telAttrs
	tel, err := tel.Check()
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return 2
	}
	if err := pool.Check(); err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return 2
	}
	poolSet := false
	fs.Visit(func(f *flag.Flag) { poolSet = poolSet || strings.HasPrefix(f.Name, "restore-pool") })
	if poolSet && pool.Size > 0 && *rt != "qemu" {
		fmt.Fprintln(stderr, "compute-agent run:", &configerr.Error{Option: "--restore-pool", Message: "the " + *rt + " runtime starts no qemu (set 0 or leave it out)"})
		return 2
	}
	nodeShell := strings.Fields(*nodeConsole)
	if len(nodeShell) > 0 {
		if _, err := exec.LookPath(nodeShell[0]); err != nil {
			fmt.Fprintf(stderr, "compute-agent run: --node-console-command: %v\n", err)
			return 2
		}
	}
	// The daemon keeps a log of its own for support bundles, besides
	// stderr.
	if lf, err := agent.OpenLog(agent.Dir(*dir)); err != nil {
		log.Warn("the agent's log file", "error", err.Error())
	} else {
		defer lf.Close()
		log = slog.New(slog.NewTextHandler(io.MultiWriter(stderr, lf), nil))
	}
	newRuntime, ok := runtimes[*rt]
	if !ok {
		fmt.Fprintf(stderr, "compute-agent run: unknown runtime %q (built in: %s)\n", *rt, strings.Join(slices.Sorted(maps.Keys(runtimes)), ", "))
		return 2
	}
	netCfg, code, err := netConfig(fs, &nf, agent.Dir(*dir), log)
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return code
	}
	// The binary as it was started: after an upgrade renamed a new one
	// over it, SIGHUP executes that path again.
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return 1
	}
	r, code, err := newRuntime(ctx, runtimeFlags{dir: *dir, accel: *accel, volumes: *volumes, memory: *memory, net: netCfg,
		domainFilter: nf.domainFilter, restorePool: pool}, log)
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return code
	}
	if d.Networks = Networks(netCfg); netCfg != nil {
		d.Underlay = netCfg.Underlay
	}
	if *rt == "recording" {
		// It boots nothing and runs any spec as recorded, networks
		// included (protocol tests and benchmarks).
		d.Networks = []string{network.ModeEgress, network.ModePrivate}
	}
	a, err := agent.New(agent.Options{Dir: agent.Dir(*dir), Runtime: r, Volumes: *volumes, Declared: d, Version: buildinfo.Version(), Log: log,
		NodeConsoleCommand: nodeShell})
	if err != nil {
		_ = r.Close()
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return 1
	}
	if tel.Enabled() {
		st, err := agent.Dir(*dir).LoadState()
		if err != nil {
			st = &agent.State{} // not joined yet: the node is named once it is
		}
		usage, _ := r.(vmruntime.UsageReporter)
		exp, err := telemetry.Start(ctx, tel, st.NodeID, st.PoolID, buildinfo.Version(), usage, log)
		if err != nil {
			_ = r.Close()
			fmt.Fprintln(stderr, "compute-agent run:", err)
			return 1
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), telemetry.ExportTimeout)
			defer cancel()
			_ = exp.Shutdown(sctx)
		}()
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var reexec atomic.Bool
	go func() {
		select {
		case <-hup:
			log.Info("SIGHUP: closing the session and executing the binary again", "binary", exe)
			reexec.Store(true)
			stopRun()
		case <-runCtx.Done():
		}
	}()
	err = a.Run(runCtx)
	// The runtime detaches from its VMs; they run on.
	_ = r.Close()
	if err != nil {
		fmt.Fprintln(stderr, "compute-agent run:", err)
		return 1
	}
	if reexec.Load() && ctx.Err() == nil {
		// The same pid: a service manager sees the daemon run on, and the
		// VMs (its children) stay its children; the new binary
		// re-attaches to them and reaps them when they end.
		err := syscall.Exec(exe, os.Args, os.Environ())
		fmt.Fprintln(stderr, "compute-agent run: execute the binary again:", err)
		return 1
	}
	return 0
}

// runtimes are the runtimes built into this compute-agent, by the name
// --runtime takes. Adding one is a line here (CONTRIBUTING.md).
var runtimes = map[string]func(context.Context, runtimeFlags, *slog.Logger) (vmruntime.Runtime, int, error){
	"qemu":      newQEMU,
	"recording": newRecording,
}

// runtimeFlags are the run flags a runtime reads.
type runtimeFlags struct {
	dir, accel, volumes, memory string
	// net is the node's VM networking; nil is none (--network none).
	net *network.Config
	// domainFilter runs the egress proxy for policies' domain entries
	// (--net-domain-filter).
	domainFilter bool
	// restorePool is the qemu runtime's pool of qemus started ahead of
	// restores (--restore-pool).
	restorePool vmruntime.RestorePool
}

// netConfig checks the network flags; the int is the exit code of a
// refusal.
func netConfig(fs *flag.FlagSet, nf *netFlags, dir agent.Dir, log *slog.Logger) (*network.Config, int, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	st := &agent.State{}
	if nf.mode != "none" {
		var err error
		if st, err = dir.LoadState(); err != nil { // the agent's id comes from the node's
			return nil, 1, err
		}
	}
	cfg, err := nf.config(set, st, log)
	if err != nil {
		return nil, 2, err
	}
	return cfg, 0, nil
}

// newRecording is the recording runtime: protocol tests and scale
// benchmarks only, it boots nothing.
func newRecording(_ context.Context, f runtimeFlags, _ *slog.Logger) (vmruntime.Runtime, int, error) {
	if f.net != nil {
		return nil, 2, errors.New("--network nftables: the recording runtime runs no VMs to network")
	}
	return &vmruntime.Recording{Dir: f.dir + "/runtime"}, 0, nil
}

// newQEMU is the qemu runtime. It refuses to start without a working
// qemu: the node would look ready and fail every instance it is given.
// The int is the exit code of a refusal.
func newQEMU(ctx context.Context, f runtimeFlags, log *slog.Logger) (vmruntime.Runtime, int, error) {
	qv, err := vmruntime.CheckQEMU(ctx)
	if err != nil {
		return nil, 1, err
	}
	log.Info("qemu found", "version", qv)
	acc, err := chooseAccel(ctx, f.dir, f.accel, log)
	if err != nil {
		return nil, 2, err
	}
	log.Info("starting the qemu runtime", "accel", acc)
	q, err := vmruntime.NewQEMU(f.dir+"/runtime", acc, log)
	if err != nil {
		return nil, 1, err
	}
	if q.MemoryDir = f.memory; q.MemoryDir != "" {
		if err := os.MkdirAll(q.MemoryDir, 0o700); err != nil {
			return nil, 1, err
		}
	}
	if err := q.UseRestorePool(f.restorePool); err != nil {
		_ = q.Close()
		return nil, 2, err
	}
	q.VolumeDir = f.volumes
	if q.VolumeDir == "" {
		q.VolumeDir = f.dir + "/volumes" // as the agent's default
	}
	if f.net != nil && f.net.NetNS != "" {
		qemu.Through = []string{"nsenter", "--net=" + f.net.NetNS} // its taps are in that namespace
	}
	if f.net != nil {
		// Domain entries of egress policies go through the node's proxy,
		// which lives as long as the process.
		if f.domainFilter {
			p, err := egressproxy.New(egressproxy.Config{NetNS: f.net.NetNS, Log: log})
			if err != nil {
				_ = q.Close()
				return nil, 1, fmt.Errorf("--net-domain-filter: %w", err)
			}
			f.net.Domains = p
		}
		// Before any spec: what an earlier agent left is removed, the VMs
		// it adopted keep their taps and are wired again.
		m, err := network.New(*f.net)
		if err == nil {
			q.NetDNS = f.net.Resolvers
			err = q.UseNetwork(m, f.net.MTU)
		}
		if err != nil {
			_ = q.Close()
			return nil, 1, fmt.Errorf("--network nftables: %w", err)
		}
		log.Info("VM networks wired", "uplink", f.net.Uplink, "egressPool", f.net.EgressPool, "privatePool", f.net.PrivatePool, "deny", f.net.Deny,
			"domainFilter", f.domainFilter)
	}
	return q, 0, nil
}

// chooseAccel decides the qemu accelerator: kvm or tcg as asked, or auto:
// TCG without /dev/kvm, else what a probe boot of the image named by
// COMPUTE_AGENT_PROBE_IMAGE (a manifest) proved, kept in <dir>/accel so
// the probe runs once per host.
func chooseAccel(ctx context.Context, dir, want string, log *slog.Logger) (string, error) {
	switch want {
	case qemu.AccelKVM, qemu.AccelTCG:
		return want, nil
	case "auto":
	default:
		return "", fmt.Errorf("--accel %q: use auto, kvm or tcg", want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "accel")); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	acc, why := qemu.AccelTCG, "no probe image (COMPUTE_AGENT_PROBE_IMAGE)"
	if _, err := os.Stat("/dev/kvm"); err != nil {
		why = "no /dev/kvm"
	} else if manifest := os.Getenv("COMPUTE_AGENT_PROBE_IMAGE"); manifest != "" {
		var im struct{ Location, Initrd, Cmdline string }
		if b, err := os.ReadFile(manifest); err == nil && json.Unmarshal(b, &im) == nil {
			acc, why = qemu.ChooseAccel(ctx, dir, im.Location, im.Initrd, im.Cmdline)
		}
	}
	log.Info("qemu acceleration", "accel", acc, "why", why)
	return acc, os.WriteFile(filepath.Join(dir, "accel"), []byte(acc+"\n"), 0o600)
}
