// Package bundle makes a node's support bundle: the daemon's logs, state
// and configuration, the runtime's view of each VM (console and qemu log
// tails, configs) and the host's facts (kernel, uptime, memory, disks,
// interfaces, processes), every entry scrubbed of secrets (Scrubber), in a
// gzipped tar with a manifest; and uploads it through a presigned PUT.
// What is never read at all: the node key, the command journal, volumes,
// guest memory and snapshots.
package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Limits of what one bundle reads.
const (
	// TailBytes is how much of the end of a log a bundle keeps.
	TailBytes = 2 << 20
	// FileBytes bounds any other file (configs, state).
	FileBytes = 1 << 20
	// CommandTimeout bounds each system command (ip, df, ps ...).
	CommandTimeout = 5 * time.Second
	// MaxRuntimeFiles bounds the files read from the runtime's directory.
	MaxRuntimeFiles = 2000
)

// Options say what to collect.
type Options struct {
	BundleID string
	NodeID   string
	Version  string // the agent's
	// AgentDir is the daemon's directory; RuntimeDir the runtime's
	// (<AgentDir>/runtime); LogDir holds the daemon's own logs.
	AgentDir, RuntimeDir, LogDir string
	// Volumes is the volume store's directory (its space is reported).
	Volumes string
	// Environ and Args are the daemon's environment and command line.
	Environ, Args []string
	Scrubber      *Scrubber
	// MaxBytes refuses a bundle larger than this (the control plane's
	// supportBundles.maxBytes).
	MaxBytes int64
	// Out is the directory the archive is written to.
	Out string
	Now time.Time
}

// Manifest is manifest.json, the bundle's first entry.
type Manifest struct {
	BundleID     string    `json:"bundleId"`
	NodeID       string    `json:"nodeId"`
	AgentVersion string    `json:"agentVersion"`
	CreatedAt    time.Time `json:"createdAt"`
	Entries      []Entry   `json:"entries"`
	Skipped      []Skip    `json:"skipped,omitempty"`
	Redactions   int       `json:"redactions"`
}

// Entry is one file of the bundle.
type Entry struct {
	Name       string `json:"name"`
	SizeBytes  int    `json:"sizeBytes"`
	Redactions int    `json:"redactions,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"` // only the tail was kept
}

// Skip is something the bundle could not collect, and why.
type Skip struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Result is a written bundle.
type Result struct {
	Path       string
	SizeBytes  int64
	SHA256     string
	Redactions int
	Entries    int
}

// ErrTooLarge is a bundle above MaxBytes; nothing is kept of it.
var ErrTooLarge = errors.New("bundle: above maxBytes")

type collector struct {
	o     Options
	m     Manifest
	files []file
}

type file struct {
	name string
	data []byte
}

// add scrubs data (as JSON when asJSON) and adds it under name.
func (c *collector) add(name string, data []byte, asJSON, truncated bool) {
	var n int
	if asJSON {
		data, n = c.o.Scrubber.JSON(data)
	} else {
		data, n = c.o.Scrubber.Text(data)
	}
	c.files = append(c.files, file{name, data})
	c.m.Entries = append(c.m.Entries, Entry{Name: name, SizeBytes: len(data), Redactions: n, Truncated: truncated})
	c.m.Redactions += n
}

func (c *collector) skip(name string, err error) {
	c.m.Skipped = append(c.m.Skipped, Skip{Name: name, Reason: err.Error()})
}

// readTail reads at most limit bytes of the end of path.
func readTail(path string, limit int64) ([]byte, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if !st.Mode().IsRegular() {
		return nil, false, fmt.Errorf("%s is not a regular file", path)
	}
	off := int64(0)
	if st.Size() > limit {
		off = st.Size() - limit
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, limit))
	if err != nil {
		return nil, false, err
	}
	if off > 0 {
		// From the first whole line on.
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return b, off > 0, nil
}

func (c *collector) addFile(name, path string, limit int64, asJSON bool) {
	b, cut, err := readTail(path, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		c.skip(name, err)
		return
	}
	c.add(name, b, asJSON && !cut, cut)
}

// Collect writes the bundle to o.Out/<bundleId>.tar.gz and returns it; a
// bundle above o.MaxBytes is removed and refused (ErrTooLarge).
func Collect(ctx context.Context, o Options) (Result, error) {
	if o.Scrubber == nil {
		o.Scrubber = NewScrubber()
	}
	c := &collector{o: o, m: Manifest{BundleID: o.BundleID, NodeID: o.NodeID, AgentVersion: o.Version, CreatedAt: o.Now.UTC()}}
	c.agent()
	c.runtime()
	c.system(ctx)
	return c.write()
}

// agent adds the daemon's own files, logs, environment and command line.
func (c *collector) agent() {
	d := c.o.AgentDir
	for _, f := range []string{"state.json", "status.json", "observed.json", "transports.json"} {
		c.addFile("agent/"+f, filepath.Join(d, f), FileBytes, true)
	}
	c.addFile("agent/accel", filepath.Join(d, "accel"), FileBytes, false)
	// The certificate's facts, not its PEM: the bundle holds no PEM block.
	if b, err := os.ReadFile(filepath.Join(d, "node.crt")); err == nil {
		if blk, _ := pem.Decode(b); blk != nil {
			if cert, err := x509.ParseCertificate(blk.Bytes); err == nil {
				uris := make([]string, 0, len(cert.URIs))
				for _, u := range cert.URIs {
					uris = append(uris, u.String())
				}
				facts, _ := json.Marshal(map[string]any{"subject": cert.Subject.String(), "issuer": cert.Issuer.String(),
					"serial": cert.SerialNumber.String(), "notBefore": cert.NotBefore, "notAfter": cert.NotAfter, "uris": uris})
				c.add("agent/certificate.json", facts, true, false)
			}
		}
	}
	if logs, err := os.ReadDir(c.o.LogDir); err == nil {
		for _, e := range logs {
			if e.Type().IsRegular() {
				c.addFile("agent/logs/"+e.Name(), filepath.Join(c.o.LogDir, e.Name()), TailBytes, false)
			}
		}
	}
	var env bytes.Buffer
	vars := slices.Clone(c.o.Environ)
	slices.Sort(vars)
	for _, kv := range vars {
		k, v, _ := strings.Cut(kv, "=")
		if IsSecretName(k) && v != "" {
			v = Redacted
		}
		fmt.Fprintf(&env, "%s=%s\n", k, v)
	}
	c.add("agent/environment.txt", env.Bytes(), false, false)
	var args bytes.Buffer
	for i, a := range c.o.Args {
		// --token X and --token=X: the value goes, whatever its shape.
		if i > 0 && strings.HasPrefix(c.o.Args[i-1], "-") && !strings.Contains(c.o.Args[i-1], "=") && IsSecretName(c.o.Args[i-1]) {
			a = Redacted
		}
		if k, _, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") && IsSecretName(k) {
			a = k + "=" + Redacted
		}
		fmt.Fprintln(&args, a)
	}
	c.add("agent/cmdline.txt", args.Bytes(), false, false)
}

// runtimeKept are the runtime's files a bundle reads: configs and logs
// (the console and qemu logs of each VM, a recording runtime's specs);
// never disks, memory, snapshots or sockets.
func runtimeKept(name string) (limit int64, asJSON, ok bool) {
	switch {
	case strings.HasSuffix(name, ".log"):
		return TailBytes, false, true
	case strings.HasSuffix(name, ".json"):
		return FileBytes, true, true
	case strings.HasSuffix(name, ".pid"):
		return FileBytes, false, true
	}
	return 0, false, false
}

func (c *collector) runtime() {
	root := c.o.RuntimeDir
	if root == "" {
		return
	}
	n := 0
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil // a VM deleted meanwhile
		}
		if e.IsDir() {
			if e.Name() == "snapshots" || e.Name() == "memory" {
				return filepath.SkipDir
			}
			return nil
		}
		limit, asJSON, ok := runtimeKept(e.Name())
		if !ok || !e.Type().IsRegular() {
			return nil
		}
		if n++; n > MaxRuntimeFiles {
			return fs.SkipAll
		}
		rel, _ := filepath.Rel(root, path)
		c.addFile("runtime/"+filepath.ToSlash(rel), path, limit, asJSON)
		return nil
	})
	if err != nil {
		c.skip("runtime", err)
	}
}

// system adds the host's facts.
func (c *collector) system(ctx context.Context) {
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		str := func(f [65]int8) string {
			b := make([]byte, 0, len(f))
			for _, ch := range f {
				if ch == 0 {
					break
				}
				b = append(b, byte(ch))
			}
			return string(b)
		}
		facts, _ := json.Marshal(map[string]string{"sysname": str(u.Sysname), "nodename": str(u.Nodename), "release": str(u.Release),
			"version": str(u.Version), "machine": str(u.Machine)})
		c.add("system/uname.json", facts, true, false)
	}
	for name, path := range map[string]string{"uptime": "/proc/uptime", "loadavg": "/proc/loadavg", "meminfo": "/proc/meminfo",
		"os-release": "/etc/os-release", "mounts": "/proc/mounts", "cpuinfo": "/proc/cpuinfo", "kernel-cmdline": "/proc/cmdline"} {
		c.addFile("system/"+name, path, FileBytes, false)
	}
	var disks bytes.Buffer
	for _, p := range []string{c.o.AgentDir, c.o.Volumes, c.o.RuntimeDir} {
		var st syscall.Statfs_t
		if p != "" && syscall.Statfs(p, &st) == nil {
			fmt.Fprintf(&disks, "%s total=%d available=%d free=%d\n", p, int64(st.Blocks)*st.Bsize, int64(st.Bavail)*st.Bsize, int64(st.Bfree)*st.Bsize)
		}
	}
	c.add("system/disks.txt", disks.Bytes(), false, false)
	if ifs, err := net.Interfaces(); err == nil {
		type iface struct {
			Name  string   `json:"name"`
			MTU   int      `json:"mtu"`
			MAC   string   `json:"mac"`
			Flags string   `json:"flags"`
			Addrs []string `json:"addrs"`
		}
		var out []iface
		for _, i := range ifs {
			f := iface{Name: i.Name, MTU: i.MTU, MAC: i.HardwareAddr.String(), Flags: i.Flags.String(), Addrs: []string{}}
			if as, err := i.Addrs(); err == nil {
				for _, a := range as {
					f.Addrs = append(f.Addrs, a.String())
				}
			}
			out = append(out, f)
		}
		b, _ := json.Marshal(out)
		c.add("system/interfaces.json", b, true, false)
	}
	for _, cmd := range []struct {
		name string
		argv []string
	}{
		{"ip-address", []string{"ip", "-d", "address"}},
		{"ip-route", []string{"ip", "route", "show", "table", "all"}},
		{"df", []string{"df", "-h"}},
		{"free", []string{"free", "-m"}},
		{"processes", []string{"ps", "-eo", "pid,ppid,etime,rss,args"}},
		{"qemu-version", []string{"qemu-system-x86_64", "--version"}},
		{"nft-ruleset", []string{"nft", "list", "ruleset"}},
		{"journal", []string{"journalctl", "-u", "compute-agent", "-n", "5000", "--no-pager"}},
	} {
		c.command(ctx, "system/"+cmd.name+".txt", cmd.argv)
	}
}

func (c *collector) command(ctx context.Context, name string, argv []string) {
	if _, err := exec.LookPath(argv[0]); err != nil {
		c.skip(name, fmt.Errorf("%s is not installed", argv[0]))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limited{w: &out, n: TailBytes}, &limited{w: &out, n: TailBytes}
	if err := cmd.Run(); err != nil && out.Len() == 0 {
		c.skip(name, fmt.Errorf("%s: %w", strings.Join(argv, " "), err))
		return
	}
	c.add(name, out.Bytes(), false, false)
}

// limited keeps the first n bytes written to it and drops the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	k := min(len(p), l.n)
	if k > 0 {
		if _, err := l.w.Write(p[:k]); err != nil {
			return 0, err
		}
		l.n -= k
	}
	return len(p), nil
}

// write makes the archive: manifest.json first, then every entry.
func (c *collector) write() (Result, error) {
	if err := os.MkdirAll(c.o.Out, 0o700); err != nil {
		return Result{}, err
	}
	path := filepath.Join(c.o.Out, c.o.BundleID+".tar.gz")
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(tmp)
	h := sha256.New()
	gz := gzip.NewWriter(io.MultiWriter(f, h))
	tw := tar.NewWriter(gz)
	manifest, _ := json.MarshalIndent(c.m, "", "  ")
	prefix := c.o.BundleID + "/"
	entries := append([]file{{"manifest.json", manifest}}, c.files...)
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: prefix + e.name, Mode: 0o600, Size: int64(len(e.data)), ModTime: c.o.Now, Typeflag: tar.TypeReg}); err != nil {
			f.Close()
			return Result{}, err
		}
		if _, err := tw.Write(e.data); err != nil {
			f.Close()
			return Result{}, err
		}
	}
	err = errors.Join(tw.Close(), gz.Close())
	st, serr := f.Stat()
	if err = errors.Join(err, serr, f.Close()); err != nil {
		return Result{}, err
	}
	if st.Size() > c.o.MaxBytes {
		return Result{}, fmt.Errorf("%w: the bundle is %d bytes, above maxBytes %d", ErrTooLarge, st.Size(), c.o.MaxBytes)
	}
	if err := os.Rename(tmp, path); err != nil {
		return Result{}, err
	}
	return Result{Path: path, SizeBytes: st.Size(), SHA256: hex.EncodeToString(h.Sum(nil)), Redactions: c.m.Redactions, Entries: len(entries)}, nil
}
