// Package openapi owns openapi.yaml: the OpenAPI 3.0.3 document built from the
// catalog with kin-openapi, validated before it is written, and marshalled
// deterministically so that regenerating it gives the same bytes. ogen
// generates gen/client from it, so it keeps to what ogen v1.24.0 generates:
// no oneOf (exactlyOne is an x-exactly-one extension), no propertyNames (map
// key patterns are an x-key-pattern extension), and one identical default
// response on every operation so that ogen returns the error envelope as a Go
// error.
package openapi

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"computeplane/tools/catalogc/catalog"
)

// Fixed parts of the document.
const (
	// Version is the OpenAPI version of the document.
	Version = "3.0.3"
	// Title is info.title.
	Title = "Compute control plane API"
	// DefaultAPIVersion is info.version unless Options says otherwise.
	DefaultAPIVersion = "0.1.0"
	// BasePath is the default base path every route hangs below.
	BasePath = "/api/compute"

	// ErrorResponseSchema is the error envelope schema.
	ErrorResponseSchema = "ErrorResponse"
	// ErrorCodeSchema is the enum of every code of errors.yaml.
	ErrorCodeSchema = "ErrorCode"
	// ErrorResponseName is the default response every operation shares;
	// ogen names the client's error type after it: ErrorStatusCode, holding
	// the HTTP status and the ErrorResponse envelope.
	ErrorResponseName = "Error"
	// BearerScheme is the security scheme of API keys and session tokens.
	BearerScheme = "bearerAuth"
	// ServiceScheme carries the X-Service: 1 header of every call.
	ServiceScheme = "serviceHeader"
	// ExtEnum lists the known values of a field left open to new ones.
	ExtEnum = "x-enum"

	// Extensions the document carries for ogen and for readers.
	ExtOperationGroup = "x-ogen-operation-group"
	ExtExactlyOne     = "x-exactly-one"
	ExtKeyPattern     = "x-key-pattern"
	ExtPhase          = "x-phase"
	ExtStatus         = "x-status"
	ExtKind           = "x-kind"
	ExtAction         = "x-action"
	ExtHTTPStatus     = "x-http-status"

	schemaRefPrefix   = "#/components/schemas/"
	paramRefPrefix    = "#/components/parameters/"
	responseRefPrefix = "#/components/responses/"
)

// Optional headers every operation accepts, described as components (not
// attached to operations, so generated clients need no params per call).
const (
	ParamRequestID   = "XRequestId"
	ParamTraceparent = "Traceparent"
)

// Options are the parts of the document that do not come from the catalog.
type Options struct {
	// APIVersion is info.version; DefaultAPIVersion when empty.
	APIVersion string
}

// Generate builds the document, validates it and marshals it.
func Generate(c *catalog.Catalog, opt Options) ([]byte, error) {
	doc, err := Build(c, opt)
	if err != nil {
		return nil, err
	}
	if err := Validate(context.Background(), doc); err != nil {
		return nil, err
	}
	return Marshal(doc)
}

// Write writes data to path (openapi.yaml).
func Write(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }

// Validate checks doc with kin-openapi, patterns and defaults included.
func Validate(ctx context.Context, doc *openapi3.T) error {
	if err := doc.Validate(ctx); err != nil {
		return fmt.Errorf("openapi: the built document does not validate: %w", err)
	}
	return nil
}

// Build turns the catalog into an OpenAPI document.
func Build(c *catalog.Catalog, opt Options) (*openapi3.T, error) {
	b := &builder{cat: c, named: map[string]*openapi3.Schema{}, schemas: openapi3.Schemas{}}
	if opt.APIVersion == "" {
		opt.APIVersion = DefaultAPIVersion
	}
	doc := &openapi3.T{
		OpenAPI: Version,
		Info: &openapi3.Info{
			Title:   Title,
			Version: opt.APIVersion,
			Description: "Generated from catalog/*.yaml by tools/catalogc; do not edit.\n\n" +
				"Every method is POST {basePath}/{group}/{method} with a JSON object body of at most 64 KiB " +
				"(an empty body counts as {}). Every request needs Content-Type: application/json and " +
				"X-Service: 1, else CSRF_REJECTED. Inputs are strict: unknown fields, wrong types and trailing " +
				"data are INVALID_INPUT naming the path. Success is 200 with {data: <output>}; failure is the " +
				"ErrorResponse envelope with the code's HTTP status. The response carries X-Request-Id.",
		},
		Servers: openapi3.Servers{{
			URL:         BasePath,
			Description: "The default base path; a deployment may configure another, so point the client at {base_url}{basePath}.",
		}},
		Paths: openapi3.NewPaths(),
	}
	// Named types first: every method refers to them, and they may refer to
	// each other, so their component schemas exist before they are filled.
	types := c.NamedTypes()
	for _, t := range types {
		b.named[t.Name] = &openapi3.Schema{}
	}
	for _, t := range types {
		*b.named[t.Name] = *b.object(t.Schema, t.Schema.Description)
		if err := b.addSchema(t.Name, b.named[t.Name]); err != nil {
			return nil, err
		}
	}
	if err := b.errorSchemas(); err != nil {
		return nil, err
	}
	errResp := &openapi3.ResponseRef{
		Ref:   responseRefPrefix + ErrorResponseName,
		Value: b.errorResponse(),
	}
	for _, g := range c.Groups {
		doc.Tags = append(doc.Tags, &openapi3.Tag{Name: g.Ident(), Description: g.Description})
		for _, m := range g.Methods {
			op, err := b.operation(m, errResp)
			if err != nil {
				return nil, err
			}
			if doc.Paths.Value(m.Route()) != nil {
				return nil, fmt.Errorf("%s: route %s is defined twice", m.Pos, m.Route())
			}
			doc.AddOperation(m.Route(), "POST", op)
		}
	}
	doc.Components = &openapi3.Components{
		Schemas:    b.schemas,
		Parameters: b.parameters(),
		Responses:  openapi3.ResponseBodies{ErrorResponseName: &openapi3.ResponseRef{Value: errResp.Value}},
		SecuritySchemes: openapi3.SecuritySchemes{
			BearerScheme: &openapi3.SecuritySchemeRef{Value: &openapi3.SecurityScheme{
				Type:        "http",
				Scheme:      "bearer",
				Description: "An API key or a session token as a bearer credential.",
			}},
			ServiceScheme: &openapi3.SecuritySchemeRef{Value: &openapi3.SecurityScheme{
				Type: "apiKey",
				In:   "header",
				Name: "X-Service",
				Description: "The header X-Service: 1, required on every call together with " +
					"Content-Type: application/json; without either the call is CSRF_REJECTED. It is not a " +
					"credential: it proves the request did not come from a plain HTML form.",
			}},
		},
	}
	return doc, nil
}

type builder struct {
	cat     *catalog.Catalog
	named   map[string]*openapi3.Schema // named types, filled in place
	schemas openapi3.Schemas
}

func (b *builder) addSchema(name string, s *openapi3.Schema) error {
	if _, ok := b.schemas[name]; ok {
		return fmt.Errorf("openapi: two schemas are named %s (a named type collides with a generated name)", name)
	}
	b.schemas[name] = &openapi3.SchemaRef{Value: s}
	return nil
}

func (b *builder) ref(name string) *openapi3.SchemaRef {
	return openapi3.NewSchemaRef(schemaRefPrefix+name, b.schemas[name].Value)
}

func (b *builder) operation(m *catalog.Method, errResp *openapi3.ResponseRef) (*openapi3.Operation, error) {
	stem := m.TypeName()
	in := b.object(m.Input, "Input of "+m.FullName()+". Strict: unknown fields, wrong types and trailing data are INVALID_INPUT.")
	if err := b.addSchema(stem+"Input", in); err != nil {
		return nil, err
	}
	out := m.Output
	var data *openapi3.SchemaRef
	if out.Ref != nil {
		data = b.ref(out.Ref.Name)
	} else {
		if err := b.addSchema(stem+"Output", b.object(out, "Output of "+m.FullName()+".")); err != nil {
			return nil, err
		}
		data = b.ref(stem + "Output")
	}
	resp := &openapi3.Schema{
		Type:        &openapi3.Types{openapi3.TypeObject},
		Description: "Success envelope of " + m.FullName() + ".",
		Properties:  openapi3.Schemas{"data": data},
		Required:    []string{"data"},
	}
	if err := b.addSchema(stem+"Result", resp); err != nil {
		return nil, err
	}
	ok := openapi3.NewResponse().
		WithDescription("Success: the output under data.").
		WithJSONSchemaRef(b.ref(stem + "Result"))
	op := &openapi3.Operation{
		OperationID: m.OperationID(),
		Tags:        []string{m.Group.Ident()},
		Summary:     summary(m.Description),
		Description: b.operationDescription(m),
		RequestBody: &openapi3.RequestBodyRef{Value: &openapi3.RequestBody{
			Required: true,
			Content:  openapi3.NewContentWithJSONSchemaRef(b.ref(stem + "Input")),
		}},
		// Every operation points at the one default response: ogen then
		// returns it as the Go error type ErrorStatusCode ("convenient errors").
		Responses: openapi3.NewResponses(
			openapi3.WithStatus(200, &openapi3.ResponseRef{Value: ok}),
		),
		Extensions: map[string]any{
			ExtOperationGroup: m.Group.TypeName(),
			ExtPhase:          m.Phase,
			ExtStatus:         m.Status,
			ExtKind:           m.Kind,
		},
	}
	op.Responses.Set("default", errResp)
	if m.Action != "" {
		op.Extensions[ExtAction] = m.Action
	}
	// X-Service: 1 is declared as an API-key scheme rather than a header
	// parameter so that generated clients send it from one place (their
	// security source) instead of taking it in every call's params.
	service := openapi3.SecurityRequirement{ServiceScheme: []string{}}
	bearer := openapi3.SecurityRequirement{ServiceScheme: []string{}, BearerScheme: []string{}}
	if m.Kind == catalog.KindPublic {
		// The credential is optional: whoami answers authenticated false without one.
		op.Security = &openapi3.SecurityRequirements{service, bearer}
	} else {
		op.Security = &openapi3.SecurityRequirements{bearer}
	}
	return op, nil
}

func (b *builder) operationDescription(m *catalog.Method) string {
	var s strings.Builder
	s.WriteString(m.Description)
	s.WriteString("\n\n")
	s.WriteString(m.PhaseNote())
	fmt.Fprintf(&s, " Kind: %s.", m.Kind)
	if m.Action != "" {
		fmt.Fprintf(&s, " Action %s on %s.", m.Action, m.Resource)
	} else {
		s.WriteString(" No credential is required.")
	}
	if id := m.Idempotency; id != nil {
		fmt.Fprintf(&s, " Idempotent under %s", id.Key)
		if len(id.Compare) > 0 {
			fmt.Fprintf(&s, " (a repeat with different %s is CONFLICT)", strings.Join(id.Compare, ", "))
		}
		s.WriteString(".")
	}
	if len(m.Events) > 0 {
		fmt.Fprintf(&s, " Publishes %s.", strings.Join(m.Events, ", "))
	}
	if len(m.Errors) > 0 {
		var errs []string
		for _, code := range m.Errors {
			if e := b.cat.ErrorCode(code); e != nil {
				errs = append(errs, fmt.Sprintf("%s (%d)", code, e.Status))
			}
		}
		fmt.Fprintf(&s, " Errors: %s.", strings.Join(errs, ", "))
	}
	return s.String()
}

func emptyDefault(v any) string {
	if _, ok := v.([]any); ok {
		return "[]"
	}
	return "{}"
}

// summary is the first sentence of a description.
func summary(desc string) string {
	desc = strings.TrimSpace(desc)
	if i := strings.Index(desc, ". "); i >= 0 {
		desc = desc[:i+1]
	}
	if i := strings.Index(desc, "; "); i >= 0 {
		desc = desc[:i] + "."
	}
	return desc
}

func (b *builder) parameters() openapi3.ParametersMap {
	return openapi3.ParametersMap{
		ParamRequestID:   {Value: requestIDParam()},
		ParamTraceparent: {Value: traceparentParam()},
	}
}

func requestIDParam() *openapi3.Parameter {
	return &openapi3.Parameter{
		Name: "X-Request-Id",
		In:   openapi3.ParameterInHeader,
		Description: "Used as the request id when 1 to 128 letters, digits and . _ : -; otherwise the server " +
			"makes one beginning req_. Returned in the X-Request-Id response header.",
		Schema: openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}}),
	}
}

func traceparentParam() *openapi3.Parameter {
	return &openapi3.Parameter{
		Name:        "traceparent",
		In:          openapi3.ParameterInHeader,
		Description: "W3C trace context (version 00, non-zero ids); an invalid one is dropped, not refused.",
		Schema:      openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}}),
	}
}

// errorSchemas adds ErrorCode and ErrorResponse.
func (b *builder) errorSchemas() error {
	var codes []any
	var lines []string
	statuses := map[string]any{}
	for _, e := range b.cat.Errors {
		codes = append(codes, e.Code)
		lines = append(lines, fmt.Sprintf("- %s (%d): %s", e.Code, e.Status, e.Description))
		statuses[e.Code] = e.Status
	}
	code := &openapi3.Schema{
		Type: &openapi3.Types{openapi3.TypeString},
		Description: "Error code; each has one HTTP status (x-http-status). New codes may be added, so " +
			"treat an unknown code by its HTTP status.\n\n" + strings.Join(lines, "\n"),
		// Not an enum: a client must not fail on a code added later.
		Extensions: map[string]any{ExtHTTPStatus: statuses, ExtEnum: codes},
	}
	if err := b.addSchema(ErrorCodeSchema, code); err != nil {
		return err
	}
	retry := func(desc string) *openapi3.SchemaRef {
		return openapi3.NewSchemaRef("", &openapi3.Schema{
			Type:        &openapi3.Types{openapi3.TypeInteger},
			Format:      "int64",
			Min:         openapi3.Float64Ptr(0),
			Description: desc,
		})
	}
	inner := &openapi3.Schema{
		Type: &openapi3.Types{openapi3.TypeObject},
		Properties: openapi3.Schemas{
			"code":         b.ref(ErrorCodeSchema),
			"message":      openapi3.NewSchemaRef("", &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeString}, Description: "Human-readable; INTERNAL_ERROR says only Internal server error."}),
			"retryAfterMs": retry("When to retry, in milliseconds (RATE_LIMITED, UNAVAILABLE)."),
			"details": openapi3.NewSchemaRef("", &openapi3.Schema{
				Type:                 &openapi3.Types{openapi3.TypeObject},
				AdditionalProperties: openapi3.AdditionalProperties{Has: openapi3.BoolPtr(true)},
				Description:          "Structured details: reason, path, issues [{message, path}], known ...",
			}),
		},
		Required: []string{"code", "message"},
	}
	env := &openapi3.Schema{
		Type:        &openapi3.Types{openapi3.TypeObject},
		Description: "Error envelope, answered with the code's HTTP status.",
		Properties: openapi3.Schemas{
			"error":        openapi3.NewSchemaRef("", inner),
			"retryAfterMs": retry("details.retryAfterMs moved to the top level; the answer also has Retry-After in whole seconds."),
		},
		Required: []string{"error"},
	}
	return b.addSchema(ErrorResponseSchema, env)
}

func (b *builder) errorResponse() *openapi3.Response {
	return openapi3.NewResponse().
		WithDescription("Error: the envelope with the code's HTTP status.").
		WithJSONSchemaRef(b.ref(ErrorResponseSchema))
}

// object converts an object schema with declared fields (a method input, a
// named type, an inline output).
func (b *builder) object(s *catalog.Schema, desc string) *openapi3.Schema {
	o := &openapi3.Schema{Type: &openapi3.Types{openapi3.TypeObject}, Properties: openapi3.Schemas{}}
	var required []string
	for _, f := range s.Fields {
		o.Properties[f.Name] = b.Schema(f.Schema)
		if f.Schema.Required {
			required = append(required, f.Name)
		}
	}
	o.Required = required
	if len(s.ExactlyOne) > 0 {
		var sets []any
		var words []string
		for _, set := range s.ExactlyOne {
			sets = append(sets, slices.Clone(set))
			words = append(words, "exactly one of "+strings.Join(set, ", "))
		}
		o.Extensions = map[string]any{ExtExactlyOne: sets}
		desc = strings.TrimSpace(desc + " Give " + strings.Join(words, "; ") + ".")
	}
	o.Description = desc
	return o
}

// Schema converts one field schema. Named types become $refs; everything
// else is inline, so ogen names nested types <Parent><Field>.
func (b *builder) Schema(s *catalog.Schema) *openapi3.SchemaRef {
	if s.Ref != nil {
		ref := openapi3.NewSchemaRef(schemaRefPrefix+s.Ref.Name, b.named[s.Ref.Name])
		if !s.Nullable {
			// OpenAPI 3.0 ignores siblings of $ref, so the field's
			// description is left to the named type.
			return ref
		}
		return openapi3.NewSchemaRef("", &openapi3.Schema{
			Nullable:    true,
			AllOf:       openapi3.SchemaRefs{ref},
			Description: s.Description,
		})
	}
	o := &openapi3.Schema{Description: s.Description, Nullable: s.Nullable}
	if s.HasDefault {
		switch s.Type {
		case catalog.TString, catalog.TInteger, catalog.TNumber, catalog.TBoolean:
			o.Default = s.Default
		default:
			// ogen v1.24.0 generates no default of an object, array or any
			// ("complex defaults"); the catalog only allows {} and [] there,
			// which the server applies, so the reference says it in words.
			o.Description = strings.TrimSpace(o.Description + " Default: " + emptyDefault(s.Default) + ".")
		}
	}
	switch s.Type {
	case catalog.TString:
		o.Type = &openapi3.Types{openapi3.TypeString}
		if s.MinLength != nil {
			o.MinLength = uint64(*s.MinLength)
		}
		if s.MaxLength != nil {
			o.MaxLength = openapi3.Uint64Ptr(uint64(*s.MaxLength))
		}
		o.Pattern = s.Pattern
		for _, e := range s.Enum {
			o.Enum = append(o.Enum, e)
		}
		o.Format = s.Format
		if s.Format == "uri" {
			// ogen maps format uri to url.URL and drops the length bound;
			// a plain string keeps the client simple and the bound checked.
			o.Format = ""
			o.Extensions = map[string]any{"x-format": "uri"}
		}
	case catalog.TInteger, catalog.TNumber:
		o.Type = &openapi3.Types{openapi3.TypeNumber}
		if s.Type == catalog.TInteger {
			o.Type = &openapi3.Types{openapi3.TypeInteger}
			o.Format = "int64"
		}
		o.Min, o.Max = s.Minimum, s.Maximum
	case catalog.TBoolean:
		o.Type = &openapi3.Types{openapi3.TypeBoolean}
	case catalog.TObject:
		if s.FreeForm() {
			o.Type = &openapi3.Types{openapi3.TypeObject}
			o.AdditionalProperties = openapi3.AdditionalProperties{Has: openapi3.BoolPtr(true)}
			break
		}
		obj := b.object(s, s.Description)
		obj.Nullable, obj.Default = o.Nullable, o.Default
		o = obj
	case catalog.TMap:
		o.Type = &openapi3.Types{openapi3.TypeObject}
		o.AdditionalProperties = openapi3.AdditionalProperties{Schema: b.Schema(s.Values)}
		if s.MaxEntries != nil {
			o.MaxProps = openapi3.Uint64Ptr(uint64(*s.MaxEntries))
		}
		if s.KeyPattern != "" {
			// OpenAPI 3.0 has no propertyNames; the server checks keys.
			o.Extensions = map[string]any{ExtKeyPattern: s.KeyPattern}
			o.Description = strings.TrimSpace(o.Description + " Keys match " + s.KeyPattern + ".")
		}
	case catalog.TArray:
		o.Type = &openapi3.Types{openapi3.TypeArray}
		o.Items = b.Schema(s.Items)
		if s.MinItems != nil {
			o.MinItems = uint64(*s.MinItems)
		}
		if s.MaxItems != nil {
			o.MaxItems = openapi3.Uint64Ptr(uint64(*s.MaxItems))
		}
	case catalog.TAny:
		// Any JSON value: the empty schema. nullable needs a type in 3.0
		// and any already admits null.
		o.Nullable = false
	}
	return openapi3.NewSchemaRef("", o)
}
