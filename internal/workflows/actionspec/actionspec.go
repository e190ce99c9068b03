// Package actionspec declares the built-in workflow actions and their
// inputs: what a profile step may name in `uses` and pass in `with`. It
// imports nothing of the project, so that the profiles group can check
// documents against it without depending on the workflow engine
// (internal/workflows implements the actions).
package actionspec

import (
	"fmt"
	"slices"
	"sort"
)

// Input is one declared input of an action.
type Input struct {
	Type     string   // string, boolean, integer
	Required bool     //
	Enum     []string // strings: the accepted values, when limited
	Doc      string
}

// Action is one built-in action.
type Action struct {
	Doc    string
	Inputs map[string]Input
}

// Actions are the built-in actions by name.
var Actions = map[string]Action{
	"power.on":    {Doc: "Powers the host on (nothing when on).", Inputs: map[string]Input{}},
	"power.off":   {Doc: "Forces the host off (nothing when off).", Inputs: map[string]Input{}},
	"power.reset": {Doc: "Forces a restart (a start when off).", Inputs: map[string]Input{}},
	"boot.set": {Doc: "Chooses the next boot device, once or persistently.", Inputs: map[string]Input{
		"device": {Type: "string", Required: true, Enum: []string{"disk", "cd", "pxe"}},
		"once":   {Type: "boolean", Doc: "only the next boot"},
	}},
	"media.insert": {Doc: "Inserts an image into a virtual media slot.", Inputs: map[string]Input{
		"slot":  {Type: "string", Required: true, Enum: []string{"cd", "usb"}},
		"image": {Type: "string", Required: true, Doc: "an image id of the image source"},
	}},
	"media.eject": {Doc: "Empties a virtual media slot.", Inputs: map[string]Input{
		"slot": {Type: "string", Required: true, Enum: []string{"cd", "usb"}},
	}},
	"agent.wait": {Doc: "Waits until the host's agent answers from the system booted from boot (and carries hostname).", Inputs: map[string]Input{
		"boot":     {Type: "string", Enum: []string{"cd", "disk"}},
		"hostname": {Type: "string", Doc: "the hostname the installed system must carry"},
	}},
	"image.write": {Doc: "Copies a raw image from a virtual medium to the host's disk and checks its sha256.", Inputs: map[string]Input{
		"image":  {Type: "string", Required: true, Doc: "an image id of format raw"},
		"source": {Type: "string", Enum: []string{"cd", "usb"}, Doc: "the slot holding it (default usb)"},
	}},
	"host.configure": {Doc: "Writes the installed system's hostname and node identity.", Inputs: map[string]Input{
		"hostname": {Type: "string", Required: true},
	}},
	"inventory": {Doc: "Records the driver's inventory as the step's output.", Inputs: map[string]Input{}},
	"console.read": {Doc: "Keeps the tail of the host's serial console as the step's output.", Inputs: map[string]Input{
		"bytes": {Type: "integer", Doc: "at most this many bytes (default and cap 16 KiB)"},
	}},
	"node.join": {Doc: "Makes the joining node ready with its inventoried capacity.", Inputs: map[string]Input{}},
}

// Issue is one problem of a step's with, by its path under with.
type Issue struct {
	Path    string
	Message string
}

// Check checks with against the declared inputs of action uses; a value
// of the form "${name}" (a workflow input) is accepted for any type. It
// returns every issue, sorted by path.
func Check(uses string, with map[string]any) ([]Issue, bool) {
	a, ok := Actions[uses]
	if !ok {
		return nil, false
	}
	var out []Issue
	for name, in := range a.Inputs {
		v, ok := with[name]
		if !ok {
			if in.Required {
				out = append(out, Issue{Path: name, Message: "is required"})
			}
			continue
		}
		if s, ok := v.(string); ok && len(s) > 3 && s[:2] == "${" && s[len(s)-1] == '}' {
			continue
		}
		switch in.Type {
		case "string":
			s, ok := v.(string)
			if !ok {
				out = append(out, Issue{Path: name, Message: "is a string"})
			} else if len(in.Enum) > 0 && !slices.Contains(in.Enum, s) {
				out = append(out, Issue{Path: name, Message: fmt.Sprintf("is one of %v, not %q", in.Enum, s)})
			}
		case "boolean":
			if _, ok := v.(bool); !ok {
				out = append(out, Issue{Path: name, Message: "is a boolean"})
			}
		case "integer":
			f, ok := v.(float64)
			if i, iok := v.(int); iok {
				f, ok = float64(i), true
			}
			if !ok || f != float64(int64(f)) {
				out = append(out, Issue{Path: name, Message: "is an integer"})
			}
		}
	}
	for name := range with {
		if _, ok := a.Inputs[name]; !ok {
			out = append(out, Issue{Path: name, Message: fmt.Sprintf("is not an input of %s", uses)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, true
}
