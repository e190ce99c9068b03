package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/tools/catalogc/catalog"
)

var update = flag.Bool("update", false, "rewrite the committed openapi.yaml from the catalog")

const (
	repoCatalog = "../../../catalog"
	committed   = "../../../openapi.yaml"
	testCatalog = "../testdata/catalog"
)

// loadCatalog loads dir, with the repository's plugin catalogs when dir is
// the repository's catalog (as make gen does).
func loadCatalog(dir string) (*catalog.Catalog, error) {
	if dir == repoCatalog {
		return catalog.LoadWithPlugins(dir, "../../../"+catalog.PluginsGlob)
	}
	return catalog.Load(dir)
}

func generate(t *testing.T, dir string) []byte {
	t.Helper()
	c, err := loadCatalog(dir)
	require.NoError(t, err)
	data, err := Generate(c, Options{})
	require.NoError(t, err)
	return data
}

// load reads written bytes back the way a consumer would.
func load(t *testing.T, data []byte) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(data)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	return doc
}

func TestWrittenDocumentValidates(t *testing.T) {
	for _, dir := range []string{repoCatalog, testCatalog} {
		t.Run(dir, func(t *testing.T) {
			data := generate(t, dir)
			doc := load(t, data)
			assert.Equal(t, Version, doc.OpenAPI)
			assert.Equal(t, Title, doc.Info.Title)
			require.Len(t, doc.Servers, 1)
			assert.Equal(t, BasePath, doc.Servers[0].URL)
		})
	}
}

// TestCommittedDocument is the golden test: openapi.yaml must be what the
// catalog generates. Run `go test ./tools/catalogc/openapi -update` (or
// `go run ./tools/catalogc gen`) after changing the catalog.
func TestCommittedDocument(t *testing.T) {
	data := generate(t, repoCatalog)
	if *update {
		require.NoError(t, Write(committed, data))
	}
	want, err := os.ReadFile(committed)
	require.NoError(t, err, "openapi.yaml is missing: run go test ./tools/catalogc/openapi -update")
	if !bytes.Equal(want, data) {
		t.Fatalf("openapi.yaml is stale: run `go run ./tools/catalogc gen` or `go test ./tools/catalogc/openapi -update`")
	}
}

func TestDeterministic(t *testing.T) {
	a, b := generate(t, repoCatalog), generate(t, repoCatalog)
	require.Equal(t, a, b)
	assert.NotContains(t, string(a), "\r")
	assert.True(t, strings.HasSuffix(string(a), "\n"))
	assert.True(t, strings.HasPrefix(string(a), "# Code generated"))
}

// Every method is one POST path with the shared conventions, and every
// operation shares the one default response: the condition for ogen's
// convenient errors (the client's ErrorStatusCode).
func TestOperations(t *testing.T) {
	c, err := loadCatalog(repoCatalog)
	require.NoError(t, err)
	doc := load(t, generate(t, repoCatalog))
	require.Equal(t, len(c.Methods()), doc.Paths.Len())
	for _, m := range c.Methods() {
		item := doc.Paths.Value(m.Route())
		require.NotNil(t, item, m.Route())
		require.Len(t, item.Operations(), 1, m.Route())
		op := item.Post
		require.NotNil(t, op, m.Route())
		assert.Equal(t, m.OperationID(), op.OperationID)
		assert.Equal(t, m.Group.TypeName(), op.Extensions[ExtOperationGroup])
		assert.Equal(t, []string{m.Group.Ident()}, op.Tags)
		assert.NotEmpty(t, op.Summary)
		if !m.Registered() {
			assert.Contains(t, op.Description, "NOT_IMPLEMENTED", m.FullName())
		}
		// Headers travel through security schemes and documented
		// components, never per-call parameters.
		assert.Empty(t, op.Parameters)
		require.True(t, op.RequestBody.Value.Required)
		assert.Equal(t, "#/components/schemas/"+m.TypeName()+"Input",
			op.RequestBody.Value.Content.Get("application/json").Schema.Ref)
		ok := op.Responses.Status(200).Value.Content.Get("application/json").Schema
		assert.Equal(t, "#/components/schemas/"+m.TypeName()+"Result", ok.Ref)
		assert.Equal(t, []string{"data"}, ok.Value.Required)
		assert.Equal(t, "#/components/responses/"+ErrorResponseName, op.Responses.Default().Ref)
		require.NotNil(t, op.Security)
		if m.Kind == catalog.KindPublic {
			assert.Equal(t, openapi3.SecurityRequirements{{ServiceScheme: {}}, {ServiceScheme: {}, BearerScheme: {}}}, *op.Security)
		} else {
			assert.Equal(t, openapi3.SecurityRequirements{{ServiceScheme: {}, BearerScheme: {}}}, *op.Security)
		}
	}
}

func TestErrorEnvelope(t *testing.T) {
	c, err := loadCatalog(repoCatalog)
	require.NoError(t, err)
	doc := load(t, generate(t, repoCatalog))
	code := doc.Components.Schemas[ErrorCodeSchema].Value
	assert.Empty(t, code.Enum, "an open list: clients must not fail on a code added later")
	known, ok := code.Extensions[ExtEnum].([]any)
	require.True(t, ok)
	require.Len(t, known, len(c.Errors))
	for i, e := range c.Errors {
		assert.Equal(t, e.Code, known[i])
	}
	service := doc.Components.SecuritySchemes[ServiceScheme].Value
	assert.Equal(t, "apiKey", service.Type)
	assert.Equal(t, "header", service.In)
	assert.Equal(t, "X-Service", service.Name)
	env := doc.Components.Schemas[ErrorResponseSchema].Value
	assert.Equal(t, []string{"error"}, env.Required)
	inner := env.Properties["error"].Value
	assert.ElementsMatch(t, []string{"code", "message"}, inner.Required)
	assert.Contains(t, inner.Properties, "retryAfterMs")
	assert.True(t, *inner.Properties["details"].Value.AdditionalProperties.Has)
	assert.Contains(t, env.Properties, "retryAfterMs")
}

// schemaJSON is one component schema, or one of its properties, as JSON.
func schemaJSON(t *testing.T, doc *openapi3.T, name, prop string) string {
	t.Helper()
	s := doc.Components.Schemas[name]
	require.NotNil(t, s, name)
	if prop != "" {
		s = s.Value.Properties[prop]
		require.NotNil(t, s, name+"."+prop)
	}
	out, err := json.Marshal(s)
	require.NoError(t, err)
	return string(out)
}

func TestSchemaFragments(t *testing.T) {
	doc := load(t, generate(t, testCatalog))
	for _, tc := range []struct {
		schema, prop, want string
	}{
		{"ThingsCreateInput", "name", `{"type":"string","maxLength":63,"pattern":"^[a-z0-9][a-z0-9._-]{0,62}$","description":"Lowercase DNS-like name."}`},
		{"ThingsCreateInput", "size", `{"type":"integer","format":"int64","minimum":1,"maximum":100,"default":10}`},
		{"ThingsCreateInput", "ratio", `{"type":"number","minimum":0}`},
		{"ThingsCreateInput", "network", `{"type":"string","enum":["egress","private","none"]}`},
		{"ThingsCreateInput", "note", `{"type":"string","maxLength":256,"nullable":true}`},
		{"ThingsCreateInput", "url", `{"type":"string","x-format":"uri","maxLength":2048}`},
		{"ThingsCreateInput", "warm", `{"$ref":"#/components/schemas/Warm"}`},
		{"ThingsCreateInput", "env", `{"type":"object","maxProperties":64,
			"additionalProperties":{"type":"string","maxLength":1024},
			"x-key-pattern":"^[A-Z_][A-Z0-9_]{0,63}$","description":"Keys match ^[A-Z_][A-Z0-9_]{0,63}$."}`},
		{"ThingsCreateInput", "tags", `{"type":"array","minItems":1,"maxItems":8,"items":{"type":"string","maxLength":32}}`},
		{"ThingsCreateInput", "volumes", `{"type":"array","maxItems":8,"items":{"$ref":"#/components/schemas/Mount"}}`},
		{"ThingsCreateInput", "labels", `{"type":"object","properties":{"team":{"type":"string","maxLength":64},
			"cost":{"type":"integer","format":"int64","minimum":0}}}`},
		{"ThingsCreateInput", "config", `{"type":"object","additionalProperties":true}`},
		// ogen generates no object default ("complex defaults"): said in words.
		{"ThingsCreateInput", "extra", `{"description":"Default: {}."}`},
		{"Mount", "readOnly", `{"type":"boolean","default":false}`},
		{"Thing", "parent", `{"nullable":true,"allOf":[{"$ref":"#/components/schemas/Warm"}],"description":"A nullable ref."}`},
		{"Thing", "createdAt", `{"type":"string","format":"date-time"}`},
		{"Warm", "", `{"type":"object","description":"Warm pool bounds.","required":["min"],"properties":{
			"min":{"type":"integer","format":"int64","minimum":0,"maximum":64},
			"max":{"type":"integer","format":"int64","minimum":0,"maximum":64,"description":"Defaults to min."}}}`},
		{"ThingsGetResult", "", `{"type":"object","description":"Success envelope of things.get.","required":["data"],
			"properties":{"data":{"$ref":"#/components/schemas/ThingsGetOutput"}}}`},
	} {
		t.Run(tc.schema+"."+tc.prop, func(t *testing.T) {
			assert.JSONEq(t, tc.want, schemaJSON(t, doc, tc.schema, tc.prop))
		})
	}
}

// exactlyOne is an extension and words, never oneOf, which ogen v1.24.0
// cannot generate for branches that differ only in required.
func TestExactlyOne(t *testing.T) {
	doc := load(t, generate(t, testCatalog))
	for _, name := range []string{"ThingsCreateInput", "Mount"} {
		s := doc.Components.Schemas[name].Value
		assert.Empty(t, s.OneOf, name)
		assert.NotNil(t, s.Extensions[ExtExactlyOne], name)
		assert.Contains(t, s.Description, "exactly one of", name)
	}
	in := doc.Components.Schemas["ThingsCreateInput"].Value
	assert.Equal(t, []any{[]any{"machineId", "offerId"}}, in.Extensions[ExtExactlyOne])
	// Inputs stay lenient for the client: no additionalProperties false.
	assert.Nil(t, in.AdditionalProperties.Has)
	assert.Contains(t, in.Description, "Strict")
}

func TestOperationText(t *testing.T) {
	doc := load(t, generate(t, testCatalog))
	create := doc.Paths.Value("/things/create").Post
	assert.Equal(t, "Creates a thing.", create.Summary)
	assert.Contains(t, create.Description, "Served since v0.1.")
	assert.Contains(t, create.Description, "INVALID_INPUT (400), CONFLICT (409)")
	assert.Contains(t, create.Description, "Publishes thing.created.")
	assert.Equal(t, "compute:things:manage", create.Extensions[ExtAction])
	archive := doc.Paths.Value("/things/archive").Post
	assert.Contains(t, archive.Description, "Planned for v0.2: answers NOT_IMPLEMENTED until then.")
	assert.Equal(t, "planned", archive.Extensions[ExtStatus])
	ping := doc.Paths.Value("/things/ping").Post
	assert.Contains(t, ping.Description, "No credential is required.")
	assert.NotContains(t, ping.Extensions, ExtAction)
}
