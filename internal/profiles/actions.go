package profiles

import (
	"computeplane/internal/workflows/actionspec"
)

// Actions are the built-in actions a step may use, with their declared
// inputs. There is one table, in internal/workflows/actionspec (a leaf
// package beside the engine that implements them); the profiles group
// checks every step's with against it, so a document the group renders is
// one the engine can start.
var Actions = actionspec.Actions

// Capabilities are what a bare-metal driver can do, as a document's
// requires names them (internal/drivers.Driver).
var Capabilities = []string{"power", "boot", "media", "console", "inventory", "agent"}

// ActionNeeds is the driver capability each built-in action needs.
var ActionNeeds = map[string]string{
	"power.on": "power", "power.off": "power", "power.reset": "power",
	"boot.set":     "boot",
	"media.insert": "media", "media.eject": "media",
	"agent.wait": "agent", "image.write": "agent", "host.configure": "agent",
	"inventory":    "inventory",
	"console.read": "console",
	"node.join":    "inventory",
}

// checkWith checks a step's with against the declared inputs of the
// action it uses; ok is false when uses is not a built-in action.
func checkWith(uses string, with map[string]any) ([]actionspec.Issue, bool) {
	if with == nil {
		with = map[string]any{}
	}
	return actionspec.Check(uses, with)
}
