package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"computeplane/internal/release"
)

// Bounds of an upgrade.
const (
	// DownloadTimeout bounds the whole download of a binary.
	DownloadTimeout = 10 * time.Minute
	// MaxBinaryBytes refuses an answer larger than any daemon binary.
	MaxBinaryBytes = release.MaxArtifactBytes
	// RestartTimeout is how long upgrade waits for the daemon to come
	// back with the new version.
	RestartTimeout = 60 * time.Second
)

// AgentName is the daemon's name in releases.
const AgentName = "compute-agent"

// UpgradeOptions are compute-agent upgrade's flags.
type UpgradeOptions struct {
	Dir Dir
	// Version is the release to install; "" or "latest" is the highest.
	Version string
	// Current is the running binary's version: the same version again is
	// not installed unless Force.
	Current string
	Force   bool
	// Exe is the binary replaced; "" is this process's.
	Exe string
	// Platform is <os>-<arch>; "" is this binary's.
	Platform string
	// ReleaseKeys are pinned beside those the node got at join
	// (--release-key): a node joined before its control plane had a
	// release key has none of its own.
	ReleaseKeys []ed25519.PublicKey
	// HTTP is the client of the download; nil is one bounded by
	// DownloadTimeout.
	HTTP *http.Client
}

// UpgradeResult says what was installed.
type UpgradeResult struct {
	From, To  string
	Installed bool // false: To is the version running (and not Force)
	Exe       string
}

// Upgrade downloads the daemon's release from the control plane the node
// joined, verifies its checksum and its signature against the pinned
// release keys, and replaces the binary with a rename (a crash leaves the
// old binary or the new one, never half of one). Nothing unverified is
// ever written over the binary.
func Upgrade(ctx context.Context, o UpgradeOptions) (*UpgradeResult, error) {
	st, err := o.Dir.LoadState()
	if err != nil {
		return nil, err
	}
	keys := append(st.ReleasePublicKeys(), o.ReleaseKeys...)
	if len(keys) == 0 {
		return nil, fmt.Errorf("agent: upgrade: %w: this node joined before its control plane had a release key; give one with --release-key (the release-key.pem of a release)", release.ErrNoKey)
	}
	version := o.Version
	if version == "" {
		version = release.Latest
	}
	if version != release.Latest {
		if err := release.CheckVersion(version); err != nil {
			return nil, err
		}
	}
	if o.Platform == "" {
		o.Platform = runtime.GOOS + "-" + runtime.GOARCH
	}
	if o.Exe == "" {
		if o.Exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if o.Exe, err = filepath.EvalSymlinks(o.Exe); err != nil {
		return nil, err
	}
	hc := o.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: DownloadTimeout}
	}
	ctx, cancel := context.WithTimeout(ctx, DownloadTimeout)
	defer cancel()
	base, err := downloadsURL(ctx, hc, st.APIURL)
	if err != nil {
		return nil, err
	}
	dl, err := release.Get(ctx, hc, base+release.Path(AgentName, version, o.Platform))
	if err != nil {
		return nil, fmt.Errorf("agent: upgrade: %w", err)
	}
	defer dl.Close()
	got := dl.Version
	if version != release.Latest && got != version {
		return nil, fmt.Errorf("agent: upgrade: asked for %s, the answer names version %q", version, got)
	}
	res := &UpgradeResult{From: o.Current, To: got, Exe: o.Exe}
	if got == o.Current && !o.Force {
		return res, nil
	}
	// Written beside the old binary, verified, then renamed over it.
	if _, err := dl.Install(o.Exe, keys, AgentName, o.Platform); err != nil {
		return nil, fmt.Errorf("agent: upgrade: %w", err)
	}
	res.Installed = true
	return res, nil
}

// downloadsURL finds {basePath}/downloads/ through the public host's
// well-known document.
func downloadsURL(ctx context.Context, hc *http.Client, api string) (string, error) {
	u, err := checkAPIURL(api)
	if err != nil {
		return "", err
	}
	scheme := u.Scheme
	switch scheme {
	case "wss":
		scheme = "https"
	case "ws":
		scheme = "http"
	}
	origin := (&url.URL{Scheme: scheme, Host: u.Host}).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, origin+"/.well-known/service", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("agent: upgrade: the well-known document: %w", err)
	}
	defer resp.Body.Close()
	var doc struct {
		BasePath string `json:"basePath"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc) != nil || !strings.HasPrefix(doc.BasePath, "/") {
		return "", fmt.Errorf("agent: upgrade: %s/.well-known/service names no base path (HTTP %d)", origin, resp.StatusCode)
	}
	return origin + doc.BasePath + "/downloads/", nil
}

// ErrNoDaemon is the answer of Restart when no daemon of this directory
// runs the binary: there is nothing to restart.
var ErrNoDaemon = errors.New("agent: no daemon of this directory runs that binary")

// Restart asks the daemon of the directory (the pid in status.json),
// which must run exe, to execute its binary again (SIGHUP: the same pid,
// so a service manager sees no restart; its VMs run on and are
// re-attached), and waits until it reports version.
func Restart(ctx context.Context, d Dir, exe, version string) error {
	var s Status
	if err := readJSON(d.path(fileStatus), &s); err != nil || s.Pid <= 0 {
		return ErrNoDaemon
	}
	if !runs(s.Pid, exe) {
		return ErrNoDaemon
	}
	signalled := time.Now()
	if err := syscall.Kill(s.Pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("agent: signal the daemon (pid %d): %w", s.Pid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, RestartTimeout)
	defer cancel()
	for {
		var now Status
		if readJSON(d.path(fileStatus), &now) == nil && now.Version == version && now.Pid == s.Pid && now.StartedAt.After(signalled) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent: the daemon (pid %d) did not come back as %s within %s", s.Pid, version, RestartTimeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runs reports whether pid executes exe (the file replaced or not).
func runs(pid int, exe string) bool {
	target, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return false
	}
	return strings.TrimSuffix(target, " (deleted)") == exe
}
