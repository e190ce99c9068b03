package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"computeplane/internal/agent/bundle"
	"computeplane/internal/agentproto"
)

// Files of support bundles in the agent's directory.
const (
	DirLogs    = "logs"    // the daemon's own log (LogFile), kept for bundles
	dirBundles = "bundles" // collected bundles waiting for their upload
	// bundleKeep is how long a collected bundle waits for its upload
	// command before the next collection removes it.
	bundleKeep = time.Hour
)

// secretSet is what the daemon knows to be secret, for scrubbing bundles:
// the values resolved for guests (held in memory only, like the values
// themselves).
type secretSet struct {
	mu     sync.Mutex
	values []string
}

func (s *secretSet) add(vs ...string) {
	s.mu.Lock()
	s.values = append(s.values, vs...)
	s.mu.Unlock()
}

func (s *secretSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.values...)
}

// scrubber knows every secret value the daemon holds: its key, the values
// resolved for guests, secret-named environment variables and flags (the
// join token among them).
func (a *Agent) scrubber() *bundle.Scrubber {
	s := bundle.NewScrubber(a.secrets.list()...)
	if b, err := os.ReadFile(a.dir.path(fileKey)); err == nil {
		s.Add(string(b))
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "-----") {
				s.Add(line)
			}
		}
	}
	if k := a.key; k != nil {
		if d, err := k.Bytes(); err == nil {
			s.Add(base64.StdEncoding.EncodeToString(d), string(d))
		}
	}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && bundle.IsSecretName(k) {
			s.Add(v)
		}
	}
	for i, arg := range os.Args {
		if k, v, ok := strings.Cut(arg, "="); ok && strings.HasPrefix(k, "-") && bundle.IsSecretName(k) {
			s.Add(v)
		} else if i+1 < len(os.Args) && strings.HasPrefix(arg, "-") && bundle.IsSecretName(arg) {
			s.Add(os.Args[i+1])
		}
	}
	return s
}

// supportBundle collects, scrubs and keeps a bundle for its upload.
func (a *Agent) supportBundle(c *agentproto.Command) (json.RawMessage, error) {
	var args agentproto.SupportBundleArgs
	if err := json.Unmarshal(c.Args, &args); err != nil {
		return nil, err
	}
	if !commandIDRe.MatchString(args.BundleID) || args.MaxBytes < 1 {
		return nil, errors.New("a bundle id of 1 to 128 characters of A-Z a-z 0-9 _ - and a positive maxBytes")
	}
	out := a.dir.path(dirBundles)
	removeOld(out, time.Now().Add(-bundleKeep))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := bundle.Collect(ctx, bundle.Options{BundleID: args.BundleID, NodeID: a.state.NodeID, Version: a.o.Version,
		AgentDir: string(a.dir), RuntimeDir: a.dir.path("runtime"), LogDir: a.dir.path(DirLogs), Volumes: a.o.Volumes,
		Environ: os.Environ(), Args: os.Args, Scrubber: a.scrubber(), MaxBytes: args.MaxBytes, Out: out, Now: time.Now()})
	if err != nil {
		return nil, err
	}
	a.log.Info("support bundle collected", "bundle", args.BundleID, "bytes", r.SizeBytes, "redactions", r.Redactions)
	return json.Marshal(agentproto.SupportBundleOutput{SizeBytes: r.SizeBytes, SHA256: r.SHA256, Redactions: r.Redactions, Entries: r.Entries})
}

// uploadSupportBundle sends a collected bundle and removes it.
func (a *Agent) uploadSupportBundle(c *agentproto.Command) (json.RawMessage, error) {
	var args agentproto.UploadSupportBundleArgs
	if err := json.Unmarshal(c.Args, &args); err != nil {
		return nil, err
	}
	if !commandIDRe.MatchString(args.BundleID) {
		return nil, errors.New("a bundle id of 1 to 128 characters of A-Z a-z 0-9 _ -")
	}
	path := filepath.Join(a.dir.path(dirBundles), args.BundleID+".tar.gz")
	defer os.Remove(path)
	hc := &http.Client{Timeout: bundle.UploadTimeout}
	if err := bundle.Upload(context.Background(), hc, path, args.URL, args.Headers, args.SizeBytes, args.MaxBytes, args.SHA256); err != nil {
		return nil, err
	}
	a.log.Info("support bundle uploaded", "bundle", args.BundleID, "bytes", args.SizeBytes)
	return json.Marshal(agentproto.SupportBundleOutput{SizeBytes: args.SizeBytes, SHA256: args.SHA256})
}

// removeOld removes the files of dir older than before.
func removeOld(dir string, before time.Time) {
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if info, err := e.Info(); err == nil && info.ModTime().Before(before) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
