package workflows

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"computeplane/internal/iam"
	"computeplane/internal/store"
)

// RunCommand runs `computed metal ...` and returns the exit code.
func RunCommand(ctx context.Context, st *store.Store, proj iam.Projection, typePrefix string, args []string, stdout, stderr io.Writer) int {
	const usage = "usage: computed metal enroll --pool <poolId> --hostname <name> --driver qemu|redfish --driver-config '<json>' " +
		"[--profile metal-host] [--profile-version N] [--input k=v ...]"
	if len(args) == 0 || args[0] != "enroll" {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("computed metal enroll", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var e Enrollment
	var driverConfig string
	inputs := inputFlag{}
	fs.StringVar(&e.PoolID, "pool", "", "a metal-host pool id")
	fs.StringVar(&e.Hostname, "hostname", "", "the host's name")
	fs.StringVar(&e.Driver, "driver", "", "the bare-metal driver: qemu or redfish")
	fs.StringVar(&driverConfig, "driver-config", "{}", "the driver's configuration as JSON (secrets as env:// references)")
	fs.StringVar(&e.ProfileID, "profile", MetalHostProfile, "the provisioning profile")
	fs.IntVar(&e.ProfileVersion, "profile-version", 0, "its version (0: the latest)")
	fs.Var(inputs, "input", "a workflow input k=v (repeatable): image, agentImage, ...")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if e.PoolID == "" || e.Hostname == "" || e.Driver == "" || !json.Valid([]byte(driverConfig)) {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	e.DriverConfig = json.RawMessage(driverConfig)
	e.Inputs = map[string]any{}
	for k, v := range inputs {
		e.Inputs[k] = v
	}
	e.StartedBy = "computed metal enroll"
	wf, err := Enroll(ctx, st, proj, typePrefix, e)
	if err != nil {
		fmt.Fprintln(stderr, "computed metal enroll:", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(wf)
	return 0
}

type inputFlag map[string]string

func (f inputFlag) String() string { return "" }

func (f inputFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want k=v")
	}
	f[k] = val
	return nil
}
