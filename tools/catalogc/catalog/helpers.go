package catalog

import (
	"fmt"
	"strconv"
	"strings"
)

// UpperFirst turns a lowerCamelCase catalog name into UpperCamelCase
// ("sandboxTemplates" -> "SandboxTemplates"), without Go initialisms: the
// OpenAPI document and the reference use it, not Go code.
func UpperFirst(name string) string {
	if name == "" {
		return ""
	}
	return strings.ToUpper(name[:1]) + name[1:]
}

// Ident is the group's name as an identifier stem in lowerCamelCase: the
// name, prefixed with the plugin's id for a plugin's group ("exampleNotes"),
// so that a plugin's group never collides with the service's.
func (g *Group) Ident() string {
	if g.Plugin != "" {
		return g.Plugin + UpperFirst(g.Name)
	}
	return g.Name
}

// TypeName is the group's Ident in UpperCamelCase.
func (g *Group) TypeName() string { return UpperFirst(g.Ident()) }

// TypeName is group and method in UpperCamelCase ("SitesCreate"), the stem
// of the method's input, output and response schema names.
func (m *Method) TypeName() string { return m.Group.TypeName() + UpperFirst(m.Name) }

// OperationID is the method's OpenAPI operationId ("sitesCreate").
func (m *Method) OperationID() string { return m.Group.Ident() + UpperFirst(m.Name) }

// PhaseNote says when a method is served, in one sentence for references.
func (m *Method) PhaseNote() string {
	switch {
	case m.Registered() && m.Phase == "none":
		return "Served, without a stable phase."
	case m.Registered():
		return fmt.Sprintf("Served since %s.", m.Phase)
	case m.Phase == "none":
		return "Planned, without a phase yet: answers NOT_IMPLEMENTED."
	default:
		return fmt.Sprintf("Planned for %s: answers NOT_IMPLEMENTED until then.", m.Phase)
	}
}

// ErrorCode returns the error code named code, or nil.
func (c *Catalog) ErrorCode(code string) *ErrorCode {
	for _, e := range c.Errors {
		if e.Code == code {
			return e
		}
	}
	return nil
}

// Event returns the event type typ, or nil.
func (c *Catalog) Event(typ string) *Event {
	for _, e := range c.Events {
		if e.Type == typ {
			return e
		}
	}
	return nil
}

// TypeLabel is the schema's type in a few words for references and the
// frozen surface: string, integer, ref:Site, array<string>, map<ref:MeterTotal>,
// object (declared fields) or object{} (free-form), any.
func (s *Schema) TypeLabel() string {
	switch {
	case s.Ref != nil:
		return "ref:" + s.Ref.Name
	case s.Type == TArray && s.Items != nil:
		return "array<" + s.Items.TypeLabel() + ">"
	case s.Type == TMap && s.Values != nil:
		return "map<" + s.Values.TypeLabel() + ">"
	case s.FreeForm():
		return "object{}"
	case s.Shape != "":
		return "string(" + s.Shape + ")"
	}
	return s.Type
}

// FormatNumber writes a bound without a trailing ".0" or an exponent.
func FormatNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
