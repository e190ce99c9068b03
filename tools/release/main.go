// Command release builds a release: computed, compute-agent, compute-guest
// and computectl, and each plugin of plugins/ as plugin-<id> (the plugin
// archive the downloads route serves under its own name), for each platform, with the version stamped, laid out as
// the downloads route serves them (internal/release), each with its
// SHA-256 checksum and an Ed25519 signature by the release key of the PKI
// bundle. `make release` runs it.
//
//	go run ./tools/release [-version v1.2.3] [-out dist/downloads]
//	    [-platforms linux/amd64,linux/arm64] [-agents computed,compute-agent,...]
//
// The builds are reproducible: CGO off, -trimpath, no build id, no VCS
// stamp; the same sources and version give the same bytes. The version
// defaults to the commit's v* tag, else a pseudo-version of the commit
// (v0.0.0-<UTC time>-<hash>).
// The PKI bundle is SERVICE_PKI (default .service/pki.json), opened with
// SERVICE_SECRET (default the contents of .service/secret); a bundle
// without a release key gets one, as `computed pki init` does.
package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"computeplane/internal/config"
	"computeplane/internal/pki"
	"computeplane/internal/release"
)

// Agents are the binaries of a release, by their command directory.
var defaultAgents = []string{"computed", "compute-agent", "compute-guest", "computectl"}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "the release version, v1.2.3 (default: a pseudo-version of the commit)")
	out := fs.String("out", "dist/downloads", "the release directory (downloads.dir serves it)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated os/arch pairs")
	all, err := withPlugins(defaultAgents)
	if err != nil {
		return err
	}
	agents := fs.String("agents", strings.Join(all, ","), "comma-separated commands under cmd/, and plugin-<id> for plugins/<id>")
	force := fs.Bool("force", false, "build again over a version already in the directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" {
		v, err := pseudoVersion()
		if err != nil {
			return err
		}
		*version = v
	}
	if err := release.CheckVersion(*version); err != nil {
		return err
	}
	key, made, err := releaseKey()
	if err != nil {
		return err
	}
	if made {
		fmt.Fprintln(stdout, "release: no PKI bundle was there: made a new one; deployments verify with the key of their own bundle, so sign with that one (SERVICE_PKI, SERVICE_SECRET)")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, release.KeyFile), release.PublicKeyPEM(key.ReleaseKey()), 0o644); err != nil {
		return err
	}
	for _, agent := range strings.Split(*agents, ",") {
		if err := release.CheckAgent(agent); err != nil {
			return err
		}
		dir := filepath.Join(*out, agent, *version)
		if _, err := os.Stat(dir); err == nil && !*force {
			return fmt.Errorf("%s exists: a released version does not change (-force builds it again)", dir)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, p := range strings.Split(*platforms, ",") {
			goos, goarch, ok := strings.Cut(p, "/")
			platform := goos + "-" + goarch
			if !ok || release.CheckPlatform(platform) != nil {
				return fmt.Errorf("platform %q: use os/arch such as linux/amd64", p)
			}
			bin := filepath.Join(dir, platform)
			if err := build(agent, *version, goos, goarch, bin); err != nil {
				return err
			}
			sum, err := fileSum(bin)
			if err != nil {
				return err
			}
			if err := os.WriteFile(bin+release.ChecksumSuffix, release.ChecksumFile(platform, sum), 0o644); err != nil {
				return err
			}
			sig := release.Sign(key.ReleaseSigning, agent, *version, platform, sum)
			if err := os.WriteFile(bin+release.SignatureSuffix, sig, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s  %x\n", filepath.Join(agent, *version, platform), sum)
		}
	}
	fmt.Fprintf(stdout, "release %s in %s, signed by the release key in %s\n", *version, *out, release.KeyFile)
	return nil
}

// pluginPrefix names a plugin's executable in a release: plugin-<id>.
const pluginPrefix = "plugin-"

// withPlugins adds plugin-<id> for every plugin of plugins/ that has a
// main package (plugins/<id>/main.go) to agents.
func withPlugins(agents []string) ([]string, error) {
	mains, err := filepath.Glob(filepath.Join("plugins", "*", "main.go"))
	if err != nil {
		return nil, err
	}
	out := append([]string(nil), agents...)
	for _, m := range mains {
		out = append(out, pluginPrefix+filepath.Base(filepath.Dir(m)))
	}
	return out, nil
}

// build compiles ./cmd/<agent> (./plugins/<id> for plugin-<id>) for
// goos/goarch into bin, reproducibly.
func build(agent, version, goos, goarch, bin string) error {
	ldflags := "-s -w -buildid= -X computeplane/internal/buildinfo.version=" + version
	src := "./cmd/" + agent
	if id, ok := strings.CutPrefix(agent, pluginPrefix); ok {
		src = "./plugins/" + id
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w", agent, goos, goarch, err)
	}
	return nil
}

func fileSum(path string) ([sha256.Size]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	defer f.Close()
	h := release.NewHashReader(f)
	if _, err := io.Copy(io.Discard, h); err != nil {
		return [sha256.Size]byte{}, err
	}
	return h.Sum(), nil
}

// releaseKey opens the PKI bundle (adding a release key to one without,
// making one where there is none, as make run would).
func releaseKey() (*pki.Bundle, bool, error) {
	secret := os.Getenv(config.EnvSecret)
	if secret == "" {
		b, err := os.ReadFile(".service/secret")
		if err != nil {
			return nil, false, errors.New("no service secret: set SERVICE_SECRET (or keep it in .service/secret)")
		}
		secret = strings.TrimSpace(string(b))
	}
	path := os.Getenv(config.EnvPKI)
	if path == "" {
		path = config.DefaultPKIFile
	}
	b, made, err := pki.Init(path, secret, "")
	if err != nil {
		return nil, false, fmt.Errorf("the PKI bundle %s: %w", path, err)
	}
	return b, made, nil
}

// pseudoVersion names the checked-out commit: its tag v* when it has
// one, else v0.0.0-<UTC commit time>-<12 hex>.
func pseudoVersion() (string, error) {
	if tag, err := exec.Command("git", "describe", "--tags", "--exact-match", "--match", "v*").Output(); err == nil {
		return strings.TrimSpace(string(tag)), nil
	}
	cmd := exec.Command("git", "log", "-1", "--format=%cd %H", "--date=format-local:%Y%m%d%H%M%S")
	cmd.Env = append(os.Environ(), "TZ=UTC")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("no -version and no git commit to name: %w", err)
	}
	ts, hash, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok || len(hash) < 12 {
		return "", errors.New("no -version and git named no commit")
	}
	return "v0.0.0-" + ts + "-" + hash[:12], nil
}
