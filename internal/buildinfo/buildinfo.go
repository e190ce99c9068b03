// Package buildinfo names this build: the product name, its release version
// and the node-daemon protocol versions it speaks.
package buildinfo

import "runtime/debug"

// Name is the product name in the server document.
const Name = "compute-control-plane"

// Agent protocol versions this control plane speaks with node daemons.
const (
	AgentProtocolMin = 1
	AgentProtocolMax = 1
)

// version is set at link time: -ldflags "-X computeplane/internal/buildinfo.version=v1.2.3".
var version = ""

// Version is the release version: the link-time value, else the module
// version, else the VCS revision, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "dev-" + s.Value[:12]
		}
	}
	return "dev"
}
