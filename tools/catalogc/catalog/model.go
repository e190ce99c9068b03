// Package catalog loads and checks the YAML method catalog (catalog/*.yaml)
// into the model every emitter of tools/catalogc works from. Every problem
// it finds is reported as "file:line: message".
package catalog

import (
	"fmt"
	"strings"
)

// Pos is where a catalog element was written.
type Pos struct {
	File string
	Line int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d", p.File, p.Line) }

// Error is a catalog problem at a position.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

func errAt(p Pos, format string, args ...any) *Error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, args...)}
}

// Catalog is the whole API surface.
type Catalog struct {
	Shapes []*Shape
	Errors []*ErrorCode
	Events []*Event
	Meters []*Meter
	Groups []*Group // sorted by name

	shapes map[string]*Shape
	types  map[string]*NamedType
}

// Shape is an identifier or string shape of shapes.yaml.
type Shape struct {
	Name        string
	Pattern     string
	MaxLength   int
	Description string
	// Words says in words what the pattern accepts, for messages.
	Words string
	Pos   Pos
}

// ErrorCode is one row of errors.yaml.
type ErrorCode struct {
	Code        string
	Status      int
	Description string
	Pos         Pos
}

// Event is one event type of events.yaml.
type Event struct {
	Type        string
	Subject     string
	Module      string
	Description string
	Payload     *Schema
	// Plugin is the plugin whose catalog declares the type, "" for the
	// service's own.
	Plugin string
	Pos    Pos
}

// Meter is one usage meter of meters.yaml: what an allocation measures per
// hour, in which unit, for which module.
type Meter struct {
	Name        string
	Unit        string
	Module      string
	Description string
	Pos         Pos
}

// Group is one catalog file: an API group.
type Group struct {
	Name string
	// Plugin is the id of the out-of-process plugin serving the group
	// (plugins/<id>/catalog), "" for the service's own groups.
	Plugin      string
	Description string
	File        string
	Types       []*NamedType
	Methods     []*Method // in file order
}

// NamedType is an object type defined under a group's types.
type NamedType struct {
	Name   string
	Group  *Group
	Schema *Schema
	Pos    Pos
}

// Method kinds and statuses.
const (
	KindRead     = "read"
	KindMutation = "mutation"
	KindPublic   = "public"

	StatusRegistered = "registered"
	StatusPlanned    = "planned"
)

// Method is one API method.
type Method struct {
	Group       *Group
	Name        string
	Phase       string
	Status      string
	Kind        string
	Action      string // empty for public methods
	Resource    *Resource
	Idempotency *Idempotency
	Wait        bool
	Events      []string
	Errors      []string
	Description string
	Input       *Schema // always an object
	Output      *Schema
	Pos         Pos

	keyPos map[string]Pos // where each key of the method was written
}

// posOf is where the method's key was written, or the method itself.
func (m *Method) posOf(key string) Pos {
	if p, ok := m.keyPos[key]; ok {
		return p
	}
	return m.Pos
}

// FullName is group.method, plugin.group.method for a plugin's method.
func (m *Method) FullName() string {
	if p := m.Group.Plugin; p != "" {
		return p + "." + m.Group.Name + "." + m.Name
	}
	return m.Group.Name + "." + m.Name
}

// Route is the path below the base path: /group/method, or
// /plugins/plugin/group/method for a plugin's method (the specification's
// mount point of plugins).
func (m *Method) Route() string {
	if p := m.Group.Plugin; p != "" {
		return "/plugins/" + p + "/" + m.Group.Name + "/" + m.Name
	}
	return "/" + m.Group.Name + "/" + m.Name
}

// Registered reports whether the method is served.
func (m *Method) Registered() bool { return m.Status == StatusRegistered }

// Resource names what the one decision of a call is made on.
type Resource struct {
	Type       string
	ID         string // input field holding the id, or "global"
	Parent     *ResourceRef
	Draft      bool
	Creates    string // type of the object a draft create makes; default Type
	Attributes []string
	Items      string
	Alternates []*Alternate
	// RootTenantOnly, when its condition holds, makes a tenantId other than
	// the root tenant's INVALID_INPUT, checked before authentication.
	RootTenantOnly *Condition
}

// Condition holds when Field is present (In empty) or holds one of In.
type Condition struct {
	Field string
	In    []string
}

// ResourceRef is a type and the input field naming its id.
type ResourceRef struct {
	Type string
	ID   string
}

// Alternate is another resource the decision is made on when a condition holds.
type Alternate struct {
	Type      string
	ID        string
	WhenField string
	WhenIn    []string // empty: when the field is present
}

// String is the resource in one line, used by the frozen surface.
func (r *Resource) String() string {
	if r == nil {
		return "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s", r.Type, r.ID)
	if r.Parent != nil {
		fmt.Fprintf(&b, " parent=%s/%s", r.Parent.Type, r.Parent.ID)
	}
	if r.Items != "" {
		fmt.Fprintf(&b, " items=%s", r.Items)
	}
	for _, a := range r.Alternates {
		fmt.Fprintf(&b, " alt=%s/%s when %s", a.Type, a.ID, a.WhenField)
		if len(a.WhenIn) > 0 {
			fmt.Fprintf(&b, " in %s", strings.Join(a.WhenIn, "|"))
		}
	}
	return b.String()
}

// Idempotency describes a method's idempotency key.
type Idempotency struct {
	Key       string
	DerivesID string
	Compare   []string
	IDPrefix  string // prefix of the derived id, from the shape of DerivesID
}

// Schema types.
const (
	TString  = "string"
	TInteger = "integer"
	TNumber  = "number"
	TBoolean = "boolean"
	TObject  = "object"
	TMap     = "map"
	TArray   = "array"
	TAny     = "any"
)

// String formats. FormatByte is base64 (RFC 4648, padded) on the wire and
// bytes in Go: the generated decoder refuses text that is not base64.
const (
	FormatDateTime = "date-time"
	FormatURI      = "uri"
	FormatByte     = "byte"
)

// Formats lists the formats a string field may declare.
var Formats = []string{FormatDateTime, FormatURI, FormatByte}

// Schema is the type of a field, an input or an output.
type Schema struct {
	Type        string
	Shape       string     // the shape it came from, if any
	Ref         *NamedType // the named type it refers to, if any
	Required    bool
	Nullable    bool
	Default     any // nil when HasDefault is false
	HasDefault  bool
	Description string

	// string
	MinLength *int
	MaxLength *int
	Pattern   string
	Enum      []string
	Format    string // one of Formats

	// integer and number
	Minimum *float64
	Maximum *float64

	// object; an object without fields is free-form
	Fields     []*Field
	ExactlyOne [][]string

	// map
	Values     *Schema
	KeyPattern string
	MaxEntries *int

	// array
	Items    *Schema
	MinItems *int
	MaxItems *int

	Pos Pos
}

// Field is a named member of an object schema.
type Field struct {
	Name   string
	Schema *Schema
}

// Object returns the object schema behind s (through a ref).
func (s *Schema) Object() *Schema {
	if s.Ref != nil {
		return s.Ref.Schema
	}
	return s
}

// FreeForm reports whether s is an object without declared fields.
func (s *Schema) FreeForm() bool {
	return s.Type == TObject && s.Ref == nil && s.Fields == nil
}

// Field returns the field named name, or nil.
func (s *Schema) Field(name string) *Field {
	for _, f := range s.Object().Fields {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// Method returns the method group.name, or nil.
func (c *Catalog) Method(full string) *Method {
	for _, g := range c.Groups {
		for _, m := range g.Methods {
			if m.FullName() == full {
				return m
			}
		}
	}
	return nil
}

// Methods lists every method, groups sorted by name, methods in file order.
func (c *Catalog) Methods() []*Method {
	var out []*Method
	for _, g := range c.Groups {
		out = append(out, g.Methods...)
	}
	return out
}

// Shape returns the shape named name, or nil.
func (c *Catalog) Shape(name string) *Shape { return c.shapes[name] }

// NamedTypes lists every named type, sorted by name.
func (c *Catalog) NamedTypes() []*NamedType {
	var out []*NamedType
	for _, g := range c.Groups {
		out = append(out, g.Types...)
	}
	sortBy(out, func(t *NamedType) string { return t.Name })
	return out
}
