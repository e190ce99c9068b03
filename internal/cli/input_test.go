package cli

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// thingsCreate has a flag of every type, as cligen would write it.
var thingsCreate = Method{
	Name: "create",
	Flags: []Flag{
		{Name: "tenant-id", Field: "tenantId", Type: String, Required: true},
		{Name: "kind", Field: "kind", Type: String, Required: true, Enum: []string{"shared", "dedicated", "custom"}},
		{Name: "size-gib", Field: "sizeGiB", Type: Int, Default: "10"},
		{Name: "ratio", Field: "ratio", Type: Number},
		{Name: "clear-iam-region", Field: "clearIamRegion", Type: Bool, Default: "false"},
		{Name: "labels", Field: "labels", Type: JSON},
		{Name: "note", Field: "note", Type: String, Nullable: true},
	},
}

func build(t *testing.T, m *Method, tenant, input string, flags ...string) map[string]any {
	t.Helper()
	body, err := buildErr(m, tenant, input, flags...)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(body, &out))
	return out
}

func buildErr(m *Method, tenant, input string, flags ...string) ([]byte, error) {
	var fv []FlagValue
	for i := 0; i < len(flags); i += 2 {
		fv = append(fv, FlagValue{Name: flags[i], Value: flags[i+1]})
	}
	var in []byte
	if input != "" {
		in = []byte(input)
	}
	return BuildInput(m, tenant, in, fv)
}

func TestBuildInputTypes(t *testing.T) {
	t.Parallel()
	got := build(t, &thingsCreate, "", "",
		"tenant-id", "acme", "kind", "custom", "size-gib", " 20", "ratio", "0.5e1",
		"clear-iam-region", "true", "labels", `{"team": "core", "n": [1, 2]}`, "note", "null")
	assert.Equal(t, map[string]any{
		"tenantId":       "acme",
		"kind":           "custom",
		"sizeGiB":        20.0,
		"ratio":          5.0,
		"clearIamRegion": true,
		"labels":         map[string]any{"team": "core", "n": []any{1.0, 2.0}},
		"note":           "null", // a string flag sends a string; null goes through --input
	}, got)

	// Exact bytes: sorted keys, compact JSON values, the number as written.
	body, err := buildErr(&thingsCreate, "", "", "tenant-id", "a", "kind", "shared", "ratio", "1e-3", "labels", "[ 1 ,2 ]")
	require.NoError(t, err)
	assert.Equal(t, `{"kind":"shared","labels":[1,2],"ratio":1e-3,"tenantId":"a"}`, string(body))

	// Defaults are the server's to apply: an absent flag sends nothing.
	assert.NotContains(t, build(t, &thingsCreate, "", "", "tenant-id", "a", "kind", "shared"), "sizeGiB")
}

func TestBuildInputFlagErrors(t *testing.T) {
	t.Parallel()
	req := []string{"tenant-id", "a", "kind", "custom"}
	for _, tt := range []struct {
		flags []string
		msg   string
	}{
		{[]string{"kind", "huge"}, `--kind must be one of shared, dedicated, custom, not "huge"`},
		{[]string{"size-gib", "1.5"}, `--size-gib must be an integer, not "1.5"`},
		{[]string{"size-gib", "99999999999999999999"}, `--size-gib must be an integer, not "99999999999999999999"`},
		{[]string{"ratio", "NaN"}, `--ratio must be a number, not "NaN"`},
		{[]string{"ratio", "0x10"}, `--ratio must be a number, not "0x10"`},
		{[]string{"ratio", `"1"`}, `--ratio must be a number, not "\"1\""`},
		{[]string{"clear-iam-region", "yes"}, `--clear-iam-region must be true or false, not "yes"`},
		{[]string{"labels", "{team: core}"}, "--labels must be JSON: invalid character 't'"},
		{[]string{"labels", "1 2"}, "--labels must be JSON: invalid character '2' after top-level value"},
		{[]string{"bogus", "1"}, "unknown flag --bogus"},
	} {
		_, err := buildErr(&thingsCreate, "", "", append(append([]string{}, req...), tt.flags...)...)
		var ue *UsageError
		require.ErrorAs(t, err, &ue, "%v", tt.flags)
		assert.Contains(t, err.Error(), tt.msg)
	}
}

func TestBuildInputRequired(t *testing.T) {
	t.Parallel()
	_, err := buildErr(&thingsCreate, "", "")
	require.EqualError(t, err, "missing required flags --tenant-id, --kind (or the fields in --input)")
	_, err = buildErr(&thingsCreate, "", "", "kind", "custom")
	require.EqualError(t, err, "missing required flag --tenant-id (or the fields in --input)")
	// From --input, or SERVICE_TENANT.
	build(t, &thingsCreate, "", `{"tenantId": "a", "kind": "custom"}`)
	build(t, &thingsCreate, "acme", "", "kind", "custom")
	// An explicit null is present: the server decides.
	build(t, &thingsCreate, "", `{"tenantId": null, "kind": "custom"}`)
}

func TestBuildInputLayers(t *testing.T) {
	t.Parallel()
	input := `{"tenantId": "from-input", "kind": "dedicated", "unknown": {"kept": true}, "note": null, "sizeGiB": 1.0}`
	got := build(t, &thingsCreate, "from-env", input, "kind", "custom")
	assert.Equal(t, map[string]any{
		"tenantId": "from-input", // --input over SERVICE_TENANT
		"kind":     "custom",     // flags over --input
		"unknown":  map[string]any{"kept": true},
		"note":     nil,
		"sizeGiB":  1.0,
	}, got)
	// --input's values are sent as written: the server judges them.
	body, err := buildErr(&thingsCreate, "", input)
	require.NoError(t, err)
	assert.Contains(t, string(body), `"sizeGiB":1.0`)
	assert.Contains(t, string(body), `"note":null`)

	// Flags over SERVICE_TENANT; the last of a repeated flag wins.
	got = build(t, &thingsCreate, "from-env", "", "tenant-id", "flag", "kind", "shared", "kind", "custom")
	assert.Equal(t, "flag", got["tenantId"])
	assert.Equal(t, "custom", got["kind"])

	// SERVICE_TENANT only fills a tenantId the method has.
	noTenant := Method{Flags: []Flag{{Name: "x", Field: "x", Type: String}}}
	assert.Equal(t, map[string]any{}, build(t, &noTenant, "acme", ""))
	assert.Equal(t, map[string]any{}, build(t, &Method{}, "acme", ""))
}

func TestBuildInputBadInput(t *testing.T) {
	t.Parallel()
	for input, msg := range map[string]string{
		"  ":             "--input is empty; it must hold a JSON object",
		`[1]`:            "--input must hold a JSON object",
		`"x"`:            "--input must hold a JSON object",
		`{"a": 1`:        "--input is not valid JSON",
		`{"a": 1} {}`:    "--input is not valid JSON",
		`{"a": tru}`:     "--input is not valid JSON",
		"\n{\"a\": 1}\n": "",
	} {
		_, err := BuildInput(&Method{}, "", []byte(input), nil)
		if msg == "" {
			assert.NoError(t, err, "%q", input)
			continue
		}
		var ue *UsageError
		require.ErrorAs(t, err, &ue, "%q", input)
		assert.Contains(t, err.Error(), msg, "%q", input)
	}
}
