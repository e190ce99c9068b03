package gogen_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/wire"
	"computeplane/tools/catalogc/catalog"
)

// These tests run the decoders generated from catalog/ (gen/api) the way
// the RPC layer does: wire.ParseObject, then the registry row's Decode.

const (
	poolID     = "pool_0123456789abcdefghjkmnpqrs"
	templateID = "sbxt_0123456789abcdefghjkmnpqrs"
)

// decode parses body and decodes it as the input of route.
func decode(t *testing.T, route, body string) (any, []wire.Issue) {
	t.Helper()
	m := api.Lookup(route)
	require.NotNil(t, m, route)
	obj, issue := wire.ParseObject([]byte(body))
	require.Nil(t, issue, "body %s", body)
	var iss wire.Issues
	in := m.Decode(obj, &iss)
	require.NotNil(t, in)
	return in, iss.List
}

func issue(path, msg string) wire.Issue { return wire.Issue{Path: path, Message: msg} }

func TestDecodeDefaults(t *testing.T) {
	t.Parallel()
	in, iss := decode(t, "/sites/list", `{"tenantId":"t1"}`)
	require.Empty(t, iss)
	list := in.(*api.SitesListInput)
	require.Equal(t, &api.SitesListInput{TenantID: "t1", Limit: 50}, list, "limit defaults to 50; absent optionals stay nil")

	in, iss = decode(t, "/sites/list", `{"tenantId":"t1","limit":10,"kind":"shared","cursor":"abc"}`)
	require.Empty(t, iss)
	list = in.(*api.SitesListInput)
	require.Equal(t, int64(10), list.Limit)
	require.Equal(t, "shared", *list.Kind)
	require.Equal(t, "abc", *list.Cursor)
	require.Nil(t, list.Region)

	in, iss = decode(t, "/sites/list", `{"tenantId":"t1","limit":1.0e1}`)
	require.Empty(t, iss)
	require.Equal(t, int64(10), in.(*api.SitesListInput).Limit, "an integer written as a number")

	in, iss = decode(t, "/sandboxTemplates/create", `{"tenantId":"t1","name":"tpl","poolId":"`+poolID+`","flavor":"small","imageId":"img"}`)
	require.Empty(t, iss)
	tpl := in.(*api.SandboxTemplatesCreateInput)
	require.Equal(t, int64(3600), tpl.DefaultTTLSeconds)
	require.False(t, tpl.UserData.Present)
	require.Nil(t, tpl.Warm)
	require.Nil(t, tpl.Env)
	require.Nil(t, tpl.Volumes)

	in, iss = decode(t, "/providerAccounts/create", `{"tenantId":"t1","provider":"hetzner","name":"main"}`)
	require.Empty(t, iss)
	require.Equal(t, map[string]any{}, in.(*api.ProviderAccountsCreateInput).Config, "config defaults to {}")

	// The empty body is {}: every required field is missing.
	m := api.Lookup("/sites/list")
	obj, perr := wire.ParseObject(nil)
	require.Nil(t, perr)
	var none wire.Issues
	m.Decode(obj, &none)
	require.Equal(t, []wire.Issue{issue("tenantId", "is required")}, none.List)
}

func TestDecodeIssues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		route string
		body  string
		want  []wire.Issue
	}{
		{
			name: "missing required fields, in field order", route: "/sites/create", body: `{}`,
			want: []wire.Issue{
				issue("tenantId", "is required"), issue("kind", "is required"),
				issue("region", "is required"), issue("idempotencyKey", "is required"),
			},
		},
		{
			name: "wrong type with its path", route: "/sites/create",
			body: `{"tenantId":5,"kind":"custom","region":"eu-west","idempotencyKey":"k1"}`,
			want: []wire.Issue{issue("tenantId", "must be a string, got number")},
		},
		{
			name: "enum", route: "/sites/create",
			body: `{"tenantId":"t1","kind":"private","region":"eu-west","idempotencyKey":"k1"}`,
			want: []wire.Issue{issue("kind", "must be one of shared, dedicated, custom")},
		},
		{
			name: "bounds", route: "/sites/list", body: `{"tenantId":"t1","limit":51}`,
			want: []wire.Issue{issue("limit", "must be at most 50")},
		},
		{
			name: "not an integer", route: "/sites/list", body: `{"tenantId":"t1","limit":1.5}`,
			want: []wire.Issue{issue("limit", "must be an integer")},
		},
		{
			name: "null is not absent for a field that is not nullable", route: "/sites/list", body: `{"tenantId":"t1","region":null}`,
			want: []wire.Issue{issue("region", "must be a string, got null")},
		},
		{
			name: "unknown fields, sorted, before the fields", route: "/sites/list", body: `{"zeta":1,"tenantId":"t1","alpha":2}`,
			want: []wire.Issue{issue("alpha", "unknown field"), issue("zeta", "unknown field")},
		},
		{
			name: "unknown field in a nested object", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","warm":{"min":1,"mx":2}}`,
			want: []wire.Issue{issue("warm.mx", "unknown field")},
		},
		{
			name: "nested field path", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","warm":{"min":65}}`,
			want: []wire.Issue{issue("warm.min", "must be at most 64")},
		},
		{
			name: "missing nested field", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","warm":{}}`,
			want: []wire.Issue{issue("warm.min", "is required")},
		},
		{
			name: "nested object of the wrong type", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","warm":[1]}`,
			want: []wire.Issue{issue("warm", "must be an object, got array")},
		},
		{
			name: "array item path", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","volumes":[{"name":"data","mountPath":"/data"},{"name":"logs","mountPath":"x"}]}`,
			want: []wire.Issue{issue("volumes[1].mountPath", "must be at least 2 characters")},
		},
		{
			name: "exactlyOne in an array item", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","volumes":[{"mountPath":"/data"}]}`,
			want: []wire.Issue{issue("volumes[0]", "exactly one of volumeId, name is required")},
		},
		{
			name: "too many items", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","volumes":[{},{},{},{},{},{},{},{},{}]}`,
			want: []wire.Issue{issue("volumes", "must have at most 8 items")},
		},
		{
			name: "map key pattern", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","env":{"HOME":"/root","lower_key":"v"}}`,
			want: []wire.Issue{issue("env.lower_key", "key must match ^[A-Z_][A-Z0-9_]{0,63}$")},
		},
		{
			name: "map value path", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","env":{"HOME":1}}`,
			want: []wire.Issue{issue("env.HOME", "must be a string, got number")},
		},
		{
			name: "every issue is collected, the first field first", route: "/sandboxTemplates/update",
			body: `{"volumes":[{"name":"v","mountPath":"x"}],"warm":{"min":-1},"templateId":"nope","tenantId":"t1"}`,
			want: []wire.Issue{
				issue("templateId", "must be a template id: sbxt_ and 26 to 52 lowercase letters and digits (no i, l, o, u) (pattern ^sbxt_[0-9a-hjkmnp-tv-z]{26,52}$)"),
				issue("warm.min", "must be at least 0"),
				issue("volumes[0].mountPath", "must be at least 2 characters"),
			},
		},
		{
			name: "exactlyOne: neither", route: "/providerAccounts/bootstrap",
			body: `{"tenantId":"t1","accountId":"pacct_0123456789abcdefghjkmnpqrs","poolId":"` + poolID + `","idempotencyKey":"k1"}`,
			want: []wire.Issue{issue("", "exactly one of machineId, offerId is required")},
		},
		{
			name: "exactlyOne: both", route: "/providerAccounts/bootstrap",
			body: `{"tenantId":"t1","accountId":"pacct_0123456789abcdefghjkmnpqrs","poolId":"` + poolID + `","idempotencyKey":"k1","machineId":"m1","offerId":"o1"}`,
			want: []wire.Issue{issue("", "exactly one of machineId, offerId is required")},
		},
		{
			name: "exactlyOne: one", route: "/providerAccounts/bootstrap",
			body: `{"tenantId":"t1","accountId":"pacct_0123456789abcdefghjkmnpqrs","poolId":"` + poolID + `","idempotencyKey":"k1","offerId":"o1"}`,
		},
		{
			name: "nullable given a wrong type", route: "/sandboxTemplates/update",
			body: `{"tenantId":"t1","templateId":"` + templateID + `","userData":5}`,
			want: []wire.Issue{issue("userData", "must be a string, got number")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, iss := decode(t, tt.route, tt.body)
			require.Equal(t, tt.want, iss)
		})
	}
}

func TestDecodeFirstIssue(t *testing.T) {
	t.Parallel()
	m := api.Lookup("/sites/create")
	// JSON object order does not matter; catalog field order does.
	obj, perr := wire.ParseObject([]byte(`{"region":5,"idempotencyKey":7,"tenantId":"t1","kind":"custom"}`))
	require.Nil(t, perr)
	var iss wire.Issues
	m.Decode(obj, &iss)
	require.Equal(t, "region: must be a string, got number", iss.First())
	require.Len(t, iss.List, 2)
	require.Equal(t, "idempotencyKey", iss.List[1].Path)
}

// A format byte field is []byte in gen/api: the decoder checks the text's
// rule, then decodes the base64; text that is not base64 is an issue on
// the field.
func TestDecodeBytes(t *testing.T) {
	t.Parallel()
	const sandboxID = "sbx_0123456789abcdefghjkmnpqrs"
	base := `"tenantId":"t1","sandboxId":"` + sandboxID + `","path":"/a"`
	in, iss := decode(t, "/sandboxes/writeFile", `{`+base+`,"contentBase64":"AP9oaQ=="}`)
	require.Empty(t, iss)
	require.Equal(t, []byte{0, 255, 'h', 'i'}, in.(*api.SandboxesWriteFileInput).ContentBase64)

	in, iss = decode(t, "/sandboxes/writeFile", `{`+base+`,"contentBase64":""}`)
	require.Empty(t, iss)
	require.Equal(t, []byte{}, in.(*api.SandboxesWriteFileInput).ContentBase64, "an empty file")

	for _, bad := range []string{`"hi there"`, `"aGk"`, `"-_8="`} {
		_, iss = decode(t, "/sandboxes/writeFile", `{`+base+`,"contentBase64":`+bad+`}`)
		require.Len(t, iss, 1, bad)
		require.Equal(t, "contentBase64", iss[0].Path, bad)
		require.Contains(t, iss[0].Message, "must be base64", bad)
	}
	_, iss = decode(t, "/sandboxes/writeFile", `{`+base+`,"contentBase64":5}`)
	require.Equal(t, []wire.Issue{issue("contentBase64", "must be a string, got number")}, iss)
}

func TestDecodeNullable(t *testing.T) {
	t.Parallel()
	base := `"tenantId":"t1","templateId":"` + templateID + `"`
	tests := []struct {
		name string
		body string
		want wire.Nullable[string]
	}{
		{name: "absent", body: `{` + base + `}`, want: wire.Nullable[string]{}},
		{name: "null", body: `{` + base + `,"userData":null}`, want: wire.Nullable[string]{Present: true, Null: true}},
		{name: "value", body: `{` + base + `,"userData":"#cloud-config"}`, want: wire.Nullable[string]{Present: true, Value: "#cloud-config"}},
		{name: "empty string is a value", body: `{` + base + `,"userData":""}`, want: wire.Nullable[string]{Present: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in, iss := decode(t, "/sandboxTemplates/update", tt.body)
			require.Empty(t, iss)
			got := in.(*api.SandboxTemplatesUpdateInput).UserData
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.want.Present && !tt.want.Null, got.Set())
		})
	}
}

func TestDecodeNested(t *testing.T) {
	t.Parallel()
	in, iss := decode(t, "/sandboxTemplates/create", `{
		"tenantId":"t1","name":"tpl","poolId":"`+poolID+`","flavor":"small","imageId":"img",
		"userData":null,"warm":{"min":2},"env":{"HOME":"/root","PATH":"/bin"},"network":"egress",
		"volumes":[{"name":"data","mountPath":"/data"},{"volumeId":"vol_0123456789abcdefghjkmnpqrs","mountPath":"/logs","readOnly":true}]
	}`)
	require.Empty(t, iss)
	tpl := in.(*api.SandboxTemplatesCreateInput)
	require.True(t, tpl.UserData.Present)
	require.True(t, tpl.UserData.Null)
	require.Equal(t, &api.Warm{Min: 2}, tpl.Warm)
	require.Equal(t, map[string]string{"HOME": "/root", "PATH": "/bin"}, tpl.Env)
	require.Equal(t, "egress", *tpl.Network)
	require.Len(t, tpl.Volumes, 2)
	require.Equal(t, "data", *tpl.Volumes[0].Name)
	require.Nil(t, tpl.Volumes[0].VolumeID)
	require.False(t, tpl.Volumes[0].ReadOnly, "readOnly defaults to false")
	require.Equal(t, "/logs", tpl.Volumes[1].MountPath)
	require.True(t, tpl.Volumes[1].ReadOnly)
}

func TestRegistryRows(t *testing.T) {
	t.Parallel()
	require.Nil(t, api.Lookup("/sites/nope"))
	require.NotEmpty(t, api.Methods)
	for _, m := range api.Methods {
		require.Same(t, m, api.Lookup(m.Route), m.FullName)
		if m.Plugin != "" {
			require.Equal(t, "/plugins/"+m.Plugin+"/"+m.Group+"/"+m.Name, m.Route)
			require.Equal(t, m.Plugin+"."+m.Group+"."+m.Name, m.FullName)
			require.True(t, strings.HasPrefix(m.Action, "compute:"+m.Plugin+":"), m.FullName)
		} else {
			require.Equal(t, "/"+m.Group+"/"+m.Name, m.Route)
			require.Equal(t, m.Group+"."+m.Name, m.FullName)
		}
		require.NotNil(t, m.Decode, m.FullName)
		require.Equal(t, m.Registered(), m.Invoke != nil, m.FullName)
		require.Equal(t, m.Kind == api.KindPublic, m.Action == "", m.FullName)
		require.Equal(t, m.Kind == api.KindPublic, m.Resource == nil, m.FullName)
		var iss wire.Issues
		require.NotNil(t, m.Decode(map[string]any{}, &iss), m.FullName)
	}
	// Every code of catalog/errors.yaml is listed and answers its status.
	cat, err := catalog.Load(filepath.Join("..", "..", "..", "catalog"))
	require.NoError(t, err)
	require.Len(t, api.Codes, len(cat.Errors))
	for i, e := range cat.Errors {
		require.Equal(t, api.Code(e.Code), api.Codes[i])
		require.Equal(t, e.Status, api.Codes[i].HTTPStatus(), e.Code)
	}
	require.Equal(t, 400, api.CodeInvalidInput.HTTPStatus())
	require.Equal(t, 501, api.CodeNotImplemented.HTTPStatus())
	require.Equal(t, 500, api.Code("NOPE").HTTPStatus())
}
