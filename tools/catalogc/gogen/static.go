package gogen

// staticSource is the part of gen/api that does not depend on the catalog:
// the registry row type and the error type. It is written as Go source and
// formatted like the rest.
const staticSource = `package api

import (
	"context"
	"fmt"
	"slices"

	"computeplane/internal/wire"
)

// Kind is how a method is called: read, mutation or public.
type Kind string

// Method kinds.
const (
	KindRead     Kind = "read"
	KindMutation Kind = "mutation"
	KindPublic   Kind = "public"
)

// Status tells whether a method is served.
type Status string

// Method statuses.
const (
	StatusRegistered Status = "registered"
	StatusPlanned    Status = "planned"
)

// ResourceRef is a resource type (without the typePrefix) and the input
// field that holds its id ("global" for the fleet).
type ResourceRef struct {
	Type    string
	IDField string
}

// Alternate is another resource the decision is made on when WhenField is
// present (WhenIn empty) or holds one of WhenIn.
type Alternate struct {
	ResourceRef
	WhenField string
	WhenIn    []string
}

// Resource is what the one decision of a call is made on.
type Resource struct {
	ResourceRef
	Parent     *ResourceRef
	Draft      bool
	// Creates is the type of the object a draft create makes (the draft
	// written to the projection); Type when they are the same.
	Creates    string
	Attributes []string
	Items      string
	Alternates []Alternate
	// RootTenantOnly, when its condition holds on the body, makes a
	// tenantId other than the root tenant's INVALID_INPUT naming the
	// field, before authentication (the envelope's Precheck).
	RootTenantOnly *Condition
}

// Condition holds when Field is present (In empty) or holds one of In.
type Condition struct {
	Field string
	In    []string
}

// Holds reports whether the condition holds on a parsed body.
func (c *Condition) Holds(fields map[string]any) bool {
	v, ok := fields[c.Field]
	if !ok || v == nil {
		return false
	}
	s, _ := v.(string)
	return len(c.In) == 0 || slices.Contains(c.In, s)
}

// Idempotency names a method's idempotency key, the id it derives and the
// fields whose difference under one key is CONFLICT.
type Idempotency struct {
	Key       string
	DerivesID string
	Compare   []string
	// IDPrefix starts the derived id (site for site_...).
	IDPrefix string
}

// Method is one row of the registry.
type Method struct {
	// Plugin is the id of the out-of-process plugin serving the method,
	// "" for the service's own groups (docs/plugins.md).
	Plugin      string
	Group       string
	Name        string
	FullName    string // group.method (plugin.group.method)
	Route       string // below the base path: /group/method (/plugins/plugin/group/method)
	Phase       string
	Status      Status
	Kind        Kind
	Action      string // empty for public methods
	Resource    *Resource
	Idempotency *Idempotency
	Wait        bool
	Events      []string
	Errors      []Code
	Description string
	// TenantScoped is true when the input has tenantId.
	TenantScoped bool
	// Decode checks a parsed body and returns the typed input (a pointer).
	Decode func(obj map[string]any, iss *wire.Issues) any
	// Invoke calls the group's service; nil for planned methods.
	Invoke func(ctx context.Context, s *Services, in any) (any, error)
}

// Registered reports whether the method is served.
func (m *Method) Registered() bool { return m.Status == StatusRegistered }

// PluginCaller serves the methods of out-of-process plugins: it sends the
// validated input of the method at route (Lookup) to the plugin process,
// writes the events it answers in the call's transaction and decodes its
// output into out (a pointer to the method's generated output type).
type PluginCaller interface {
	CallPlugin(ctx context.Context, route string, in, out any) error
}

// Lookup returns the method at route (below the base path), or nil.
func Lookup(route string) *Method { return methodsByRoute[route] }

// Error is a service error: a code of the catalog, a message for people and
// optional structured details.
type Error struct {
	Code    Code
	Message string
	Details map[string]any
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// HTTPStatus is the status the code answers with.
func (e *Error) HTTPStatus() int { return e.Code.HTTPStatus() }

// Errorf builds a service error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// WithDetails returns e with details set.
func (e *Error) WithDetails(details map[string]any) *Error {
	e.Details = details
	return e
}

// NotImplemented is the answer of a planned method.
func NotImplemented(m *Method) *Error {
	phase := m.Phase
	if phase == "none" {
		return Errorf(CodeNotImplemented, "%s is not implemented yet: it is planned without a phase", m.FullName)
	}
	return Errorf(CodeNotImplemented, "%s is not implemented yet: it is planned for %s", m.FullName, phase)
}

// HTTPStatus is the status the code answers with; an unknown code is 500.
func (c Code) HTTPStatus() int {
	if s, ok := codeStatus[c]; ok {
		return s
	}
	return 500
}
`
