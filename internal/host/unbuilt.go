package host

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/drivers"
)

// CheckBuilt refuses (INVALID_CONFIG) a configuration this build cannot
// honour: an option it parses but does not implement yet (accepting it
// would silently do nothing), a bare-metal driver it does not have, or a
// downloads directory that is not there. Every problem is reported
// (config.Errors when there are several). The main calls it before any
// connection opens, and `computed config check` after config.Load;
// Assemble checks the same.
func CheckBuilt(cfg *config.Config, plugins builtin.Plugins) error {
	var list []*config.Error
	list = append(list, config.Problems(refuseUnbuilt(cfg))...)
	_, err := supportBundleStore(cfg, os.Getenv)
	list = append(list, config.Problems(err)...)
	_, err = enabledDrivers(cfg, plugins.Drivers)
	list = append(list, config.Problems(err)...)
	_, err = downloadSource(cfg)
	list = append(list, config.Problems(err)...)
	return config.Join(list)
}

// CheckConfig loads the configuration (config.Check) and checks it
// against this build (CheckBuilt), offline: no connection is opened. It
// reports every problem of both at once. A process starts only on a
// configuration it returns without error; `computed config check` runs
// the same.
func CheckConfig(getenv func(string) string, plugins builtin.Plugins) (*config.Config, error) {
	cfg, err := config.Check(getenv)
	if cfg == nil {
		return nil, err
	}
	list := config.Problems(err)
	list = append(list, config.Problems(CheckBuilt(cfg, plugins))...)
	if err := config.Join(list); err != nil {
		return nil, err
	}
	return cfg, nil
}

func refuseUnbuilt(cfg *config.Config) error {
	unbuilt := []struct {
		option string
		set    bool
		phase  string
	}{
		{"downloads.blob", cfg.Downloads != nil && cfg.Downloads.Blob != "", "downloads from a blob store are not built yet (downloads.dir is)"},
		{"modules", len(cfg.Modules) > 0, "extra modules are not built yet"},
		{"plugins", len(cfg.Plugins) > 0, "plugins are not built yet"},
		{"attestors", len(cfg.Attestors) > 0, "join attestors beyond the join token are not built yet"},
	}
	var list []*config.Error
	for _, u := range unbuilt {
		if u.set {
			list = append(list, &config.Error{Option: u.option, Message: "not implemented in this build: " + u.phase + "; remove the option"})
		}
	}
	return config.Join(list)
}

// enabledDrivers keeps the bare-metal drivers the drivers option names
// (every built-in one when it is empty); a name not built in is refused.
func enabledDrivers(cfg *config.Config, builtIn drivers.Registry) (drivers.Registry, error) {
	if len(cfg.Drivers) == 0 {
		return builtIn, nil
	}
	out := drivers.Registry{}
	var list []*config.Error
	for i, name := range cfg.Drivers {
		open, ok := builtIn[name]
		if !ok {
			list = append(list, &config.Error{Option: fmt.Sprintf("drivers[%d]", i),
				Message: fmt.Sprintf("driver %q is not built into this binary (built in: %s)", name, strings.Join(slices.Sorted(maps.Keys(builtIn)), ", "))})
			continue
		}
		out[name] = open
	}
	if err := config.Join(list); err != nil {
		return nil, err
	}
	return out, nil
}
