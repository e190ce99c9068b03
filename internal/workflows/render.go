package workflows

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
)

// Phases of a step, in the order a profile runs them.
var Phases = []string{"prepare", "provision", "configure", "verify"}

// Step is one expanded step of a rendered profile.
type Step struct {
	Name      string         `json:"name"`
	Phase     string         `json:"phase"`
	Uses      string         `json:"uses"` // a built-in action (Actions)
	With      map[string]any `json:"with"`
	TimeoutMs int64          `json:"timeoutMs"`
	Retries   int            `json:"retries"`
}

// Rendered is a profile version expanded into steps.
type Rendered struct {
	Tenant  string // the profile's owner: the caller's, a public one's, or builtin
	ID      string
	Version int
	Steps   []Step
}

// Renderer expands a profile version as tenant sees it (own, public,
// module-shipped) into its steps; version 0 is the latest.
type Renderer interface {
	Render(ctx context.Context, tx pgx.Tx, tenant, profileID string, version int) (*Rendered, error)
}

// Locker makes a profile version immutable once a workflow uses it.
type Locker interface {
	Lock(ctx context.Context, tx pgx.Tx, profileTenant, profileID string, version int) error
}

// BuiltinTenant owns the profiles modules ship.
const BuiltinTenant = "builtin"

// MetalHostProfile provisions a metal host: it boots the in-memory agent
// from virtual media, writes the image to the local disk, configures it,
// reboots into it and joins the node to its pool. Inputs: image (an image
// id of format raw holding the system), agentImage (a kernel+initrd image
// whose init is compute-guest), hostname.
const MetalHostProfile = "metal-host"

// Builtin renders the profiles this module ships (tenant builtin), and
// passes every other profile to Next (the profiles group) when set.
type Builtin struct {
	Next Renderer
}

func sec(s int64) int64 { return s * 1000 }

var builtins = map[string]map[int][]Step{
	MetalHostProfile: {1: {
		{Name: "power-off", Phase: "prepare", Uses: "power.off", With: map[string]any{}, TimeoutMs: sec(30), Retries: 2},
		{Name: "insert-agent", Phase: "prepare", Uses: "media.insert", With: map[string]any{"slot": "cd", "image": "${agentImage}"}, TimeoutMs: sec(30), Retries: 2},
		{Name: "insert-image", Phase: "prepare", Uses: "media.insert", With: map[string]any{"slot": "usb", "image": "${image}"}, TimeoutMs: sec(30), Retries: 2},
		{Name: "boot-agent", Phase: "prepare", Uses: "boot.set", With: map[string]any{"device": "cd", "once": true}, TimeoutMs: sec(30), Retries: 2},
		{Name: "power-on", Phase: "prepare", Uses: "power.on", With: map[string]any{}, TimeoutMs: sec(60), Retries: 2},
		{Name: "wait-agent", Phase: "provision", Uses: "agent.wait", With: map[string]any{"boot": "cd"}, TimeoutMs: sec(180), Retries: 1},
		{Name: "write-image", Phase: "provision", Uses: "image.write", With: map[string]any{"image": "${image}", "source": "usb"}, TimeoutMs: sec(600), Retries: 2},
		{Name: "configure-host", Phase: "configure", Uses: "host.configure", With: map[string]any{"hostname": "${hostname}"}, TimeoutMs: sec(120), Retries: 2},
		{Name: "eject-agent", Phase: "configure", Uses: "media.eject", With: map[string]any{"slot": "cd"}, TimeoutMs: sec(30), Retries: 2},
		{Name: "eject-image", Phase: "configure", Uses: "media.eject", With: map[string]any{"slot": "usb"}, TimeoutMs: sec(30), Retries: 2},
		{Name: "boot-disk", Phase: "configure", Uses: "boot.set", With: map[string]any{"device": "disk", "once": false}, TimeoutMs: sec(30), Retries: 2},
		{Name: "reboot", Phase: "configure", Uses: "power.reset", With: map[string]any{}, TimeoutMs: sec(60), Retries: 2},
		{Name: "wait-system", Phase: "verify", Uses: "agent.wait", With: map[string]any{"boot": "disk", "hostname": "${hostname}"}, TimeoutMs: sec(180), Retries: 1},
		{Name: "join", Phase: "verify", Uses: "node.join", With: map[string]any{}, TimeoutMs: sec(60), Retries: 2},
	}},
}

// Render answers builtin profiles, then asks Next.
func (b Builtin) Render(ctx context.Context, tx pgx.Tx, tenant, profileID string, version int) (*Rendered, error) {
	if versions, ok := builtins[profileID]; ok {
		if version == 0 {
			for v := range versions {
				version = max(version, v)
			}
		}
		if steps, ok := versions[version]; ok {
			return &Rendered{Tenant: BuiltinTenant, ID: profileID, Version: version, Steps: steps}, nil
		}
	}
	if b.Next != nil {
		return b.Next.Render(ctx, tx, tenant, profileID, version)
	}
	return nil, api.Errorf(api.CodeNotFound, "profileId: profile %s version %d not found", profileID, version)
}

// substitute replaces string values "${name}" of with by inputs[name]
// (keeping the input's type); a missing input is an error naming the step.
func substitute(step Step, inputs map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(step.With))
	for k, v := range step.With {
		s, ok := v.(string)
		if !ok || !strings.HasPrefix(s, "${") || !strings.HasSuffix(s, "}") {
			out[k] = v
			continue
		}
		name := s[2 : len(s)-1]
		iv, ok := inputs[name]
		if !ok {
			return nil, fmt.Errorf("step %s: with.%s needs the input %s", step.Name, k, name)
		}
		out[k] = iv
	}
	return out, nil
}
