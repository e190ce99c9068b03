package host

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/drivers"
)

// CheckBuilt refuses (INVALID_CONFIG) a configuration this build cannot
// honour: an option it parses but does not implement yet (accepting it
// would silently do nothing), or a bare-metal driver it does not have. The
// main calls it before any connection opens; Assemble checks the same.
func CheckBuilt(cfg *config.Config, plugins builtin.Plugins) error {
	if err := refuseUnbuilt(cfg); err != nil {
		return err
	}
	_, err := enabledDrivers(cfg, plugins.Drivers)
	return err
}

func refuseUnbuilt(cfg *config.Config) error {
	unbuilt := []struct {
		option string
		set    bool
		phase  string
	}{
		{"tunnels.ssh", cfg.Tunnels != nil && cfg.Tunnels.SSH, "SSH tunnels and certificates are not built yet (exec tunnels are)"},
		{"downloads.blob", cfg.Downloads != nil && cfg.Downloads.Blob != "", "downloads from a blob store are not built yet (downloads.dir is)"},
		{"supportBundles", cfg.SupportBundles != nil, "support bundles are not built yet"},
		{"modules", len(cfg.Modules) > 0, "extra modules are not built yet"},
		{"plugins", len(cfg.Plugins) > 0, "plugins are not built yet"},
		{"attestors", len(cfg.Attestors) > 0, "join attestors beyond the join token are not built yet"},
	}
	for _, u := range unbuilt {
		if u.set {
			return &config.Error{Option: u.option, Message: "not implemented in this build: " + u.phase + "; remove the option"}
		}
	}
	return nil
}

// enabledDrivers keeps the bare-metal drivers the drivers option names
// (every built-in one when it is empty); a name not built in is refused.
func enabledDrivers(cfg *config.Config, builtIn drivers.Registry) (drivers.Registry, error) {
	if len(cfg.Drivers) == 0 {
		return builtIn, nil
	}
	out := drivers.Registry{}
	for i, name := range cfg.Drivers {
		open, ok := builtIn[name]
		if !ok {
			return nil, &config.Error{Option: fmt.Sprintf("drivers[%d]", i),
				Message: fmt.Sprintf("driver %q is not built into this binary (built in: %s)", name, strings.Join(slices.Sorted(maps.Keys(builtIn)), ", "))}
		}
		out[name] = open
	}
	return out, nil
}
