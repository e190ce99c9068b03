// Package cli is the hand-written runtime of computectl, the command line of
// the API. The commands themselves are generated from the catalog into
// gen/cli (one per registered method, a flag per input field); this package
// parses the command line, builds the method's JSON input from flags and
// --input, calls the API through the generated client (gen/client) and
// prints the answer as a table or as JSON, or the error with an exit code
// by error class.
package cli

import (
	"context"

	"computeplane/gen/client"
)

// FlagType is how a flag's text becomes a JSON value.
type FlagType string

// Flag types.
const (
	// String sends the text as a JSON string.
	String FlagType = "string"
	// Int sends a base-10 integer.
	Int FlagType = "int"
	// Number sends a JSON number.
	Number FlagType = "number"
	// Bool sends true or false; the flag alone is true, --flag=false is false.
	Bool FlagType = "bool"
	// JSON sends the text, which must be one JSON value: objects, arrays,
	// maps and any.
	JSON FlagType = "json"
	// Wait sends wait { timeoutMs } (the Waiting convention): the text is
	// a duration (30s), or the JSON object; the flag alone is DefaultWait.
	Wait FlagType = "wait"
)

// Flag is one top-level field of a method's input.
type Flag struct {
	Name     string   // kebab-case of Field: "tenant-id"
	Field    string   // the input field: "tenantId"
	Type     FlagType // how the text becomes JSON
	Required bool     // the field must be present (from a flag, --input or SERVICE_TENANT)
	Nullable bool     // null is accepted; only --input can send it
	Enum     []string // allowed values of a string
	Default  string   // the catalog default as shown in help, "" when none
	Help     string   // the field's description
	// Local flags are computectl's own (sandboxes writeFile --from): they
	// are not sent.
	Local bool
}

// Method is one subcommand: a registered method of the catalog.
type Method struct {
	Name        string // "create"
	Description string
	Kind        string // read, mutation or public
	Action      string // the action decided on; "" for public methods
	// IDField is the own id of the object answered (of each item of a
	// list), "" when it has none: what -q prints.
	IDField string
	Flags   []Flag // in catalog order
	// Call calls the method through the generated client. The runtime puts
	// the JSON input into ctx (the body of the request) and reads the
	// answer's data from there; the typed input only selects the operation.
	Call func(ctx context.Context, c *client.Client) error
}

// Group is a group of subcommands: an API group.
type Group struct {
	Name        string
	Description string
	Methods     []Method
}

// Flag returns the flag of the input field named field, or nil.
func (m *Method) Flag(field string) *Flag {
	for i := range m.Flags {
		if m.Flags[i].Field == field {
			return &m.Flags[i]
		}
	}
	return nil
}

// flagNamed returns the flag named name (kebab-case), or nil.
func (m *Method) flagNamed(name string) *Flag {
	for i := range m.Flags {
		if m.Flags[i].Name == name {
			return &m.Flags[i]
		}
	}
	return nil
}

// method returns the method named name, or nil.
func (g *Group) method(name string) *Method {
	for i := range g.Methods {
		if g.Methods[i].Name == name {
			return &g.Methods[i]
		}
	}
	return nil
}

func findGroup(groups []Group, name string) *Group {
	for i := range groups {
		if groups[i].Name == name {
			return &groups[i]
		}
	}
	return nil
}
