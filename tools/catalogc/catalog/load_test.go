package catalog_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/tools/catalogc/catalog"
)

// TestNegative loads every catalog under testdata/negative: each must fail
// with "file:line: message" naming the file and line where the problem is
// written.
func TestNegative(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		file string
		line int
		msg  string
	}{
		"unknown_method_key":             {"things.yaml", 12, `method get: unknown key "colour"`},
		"unknown_field_key":              {"things.yaml", 20, `field name: unknown key "colour"`},
		"unknown_shape":                  {"things.yaml", 19, `unknown shape "ThingID"`},
		"unknown_ref":                    {"things.yaml", 18, `unknown type "Owner"`},
		"unknown_qualified_ref":          {"things.yaml", 18, `unknown type "other.Thing"`},
		"unknown_output_type":            {"things.yaml", 18, `output names unknown type "Things"`},
		"bad_phase":                      {"things.yaml", 9, `phase "0.1" must look like v0.1 or be none`},
		"bad_meter_name":                 {"meters.yaml", 4, `meter "Bad.Meter" is not a MeterName`},
		"bad_status":                     {"things.yaml", 10, `status must be registered or planned, not "served"`},
		"bad_kind":                       {"things.yaml", 11, `kind must be read, mutation or public, not "query"`},
		"public_with_action":             {"things.yaml", 8, "public method things.get must have action null and no resource"},
		"non_public_without_resource":    {"things.yaml", 8, "method things.get of kind read needs an action and a resource"},
		"bad_action":                     {"things.yaml", 12, `action "things:read" must match ^compute:`},
		"bad_action_case":                {"things.yaml", 12, `action "compute:Things:read" must match ^compute:`},
		"unknown_error_code":             {"things.yaml", 14, "things.get: unknown error code GONE"},
		"group_name_mismatch":            {"things.yaml", 1, `group "thing" must be defined in thing.yaml or thing.methods.yaml`},
		"methods_file_name_mismatch":     {"things.methods.yaml", 1, `group "thing" must be defined in thing.yaml or thing.methods.yaml`},
		"group_defined_twice":            {"things.yaml", 1, "group things is already defined in "},
		"duplicate_type_across_groups":   {"things.yaml", 4, "type Thing is already defined at "},
		"required_with_default":          {"things.yaml", 18, "field limit: a required field takes no default"},
		"nullable_with_default":          {"things.yaml", 18, "field note: a nullable field takes no default"},
		"unknown_format":                 {"things.yaml", 18, `unknown format "bytes" (one of date-time, uri, byte)`},
		"byte_with_default":              {"things.yaml", 18, "field note: format byte takes no default, pattern or enum"},
		"default_out_of_bounds":          {"things.yaml", 18, "field limit: default 60 is out of bounds"},
		"default_not_in_enum":            {"things.yaml", 18, `field kind: default "dedicated" is not one of the enum values`},
		"default_wrong_type":             {"things.yaml", 18, "field limit: default must be an integer"},
		"min_above_max":                  {"things.yaml", 18, "field limit: minimum above maximum"},
		"min_length_above_max_length":    {"things.yaml", 18, "field name: minLength above maxLength"},
		"map_without_values":             {"things.yaml", 18, "map env needs values"},
		"array_without_items":            {"things.yaml", 18, "array tags needs items"},
		"exactly_one_missing_field":      {"things.yaml", 19, `exactlyOne names "offerId", which is not a field`},
		"exactly_one_type_missing_field": {"things.yaml", 8, `exactlyOne names "label", which is not a field`},
		"idempotency_key_not_input":      {"things.yaml", 14, `things.get: idempotency key "idempotencyKey" is not an input field`},
		"resource_id_not_input":          {"things.yaml", 13, `things.get: resource id "thingKey" is not an input field`},
		"bad_pattern":                    {"things.yaml", 18, `pattern "^[a-z$" does not compile`},
		"unanchored_pattern":             {"things.yaml", 18, `pattern "[a-z]+" must be anchored with ^ and $`},
		"unanchored_shape_pattern":       {"shapes.yaml", 3, `pattern "[a-z]+" must be anchored with ^ and $`},
		"yaml_duplicate_key":             {"things.yaml", 16, `method get: duplicate key "status"`},
		"yaml_syntax":                    {"things.yaml", 15, "mapping values are not allowed in this context"},
		"max_length_not_integer":         {"things.yaml", 18, "maxLength must be an integer"},
		"max_length_quoted_number":       {"things.yaml", 18, "maxLength must be an integer"},
		"required_not_boolean":           {"things.yaml", 18, "required must be true or false"},
		"enum_not_list":                  {"things.yaml", 18, "enum must be a list"},
		"status_not_http_error":          {"errors.yaml", 4, "status 200 of GONE is not an HTTP error status"},
	}

	dirs, err := os.ReadDir(filepath.Join("testdata", "negative"))
	require.NoError(t, err)
	var names []string
	for _, d := range dirs {
		names = append(names, d.Name())
	}
	require.ElementsMatch(t, names, keys(tests), "every negative case has an expectation and every expectation a directory")

	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("testdata", "negative", name)
			c, err := catalog.Load(dir)
			require.Error(t, err)
			require.Nil(t, c)

			var cerr *catalog.Error
			require.True(t, errors.As(err, &cerr), "want a *catalog.Error, got %T: %v", err, err)
			require.Equal(t, tt.file, filepath.Base(cerr.Pos.File), err.Error())
			require.Equal(t, filepath.Join(dir, tt.file), cerr.Pos.File)
			require.Equal(t, tt.line, cerr.Pos.Line, err.Error())
			prefix := fmt.Sprintf("%s:%d: ", cerr.Pos.File, tt.line)
			require.True(t, strings.HasPrefix(err.Error(), prefix), "%q does not start with %q", err.Error(), prefix)
			require.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestNegativeDuplicateTypeNamesTheFirstDefinition(t *testing.T) {
	t.Parallel()
	_, err := catalog.Load(filepath.Join("testdata", "negative", "duplicate_type_across_groups"))
	require.ErrorContains(t, err, filepath.Join("testdata", "negative", "duplicate_type_across_groups", "extras.yaml")+":4")
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func fieldNames(s *catalog.Schema) []string {
	var out []string
	for _, f := range s.Object().Fields {
		out = append(out, f.Name)
	}
	return out
}

// lineOf is the 1-based line of the first line of file equal to text.
func lineOf(t *testing.T, file, text string) int {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	for i, l := range strings.Split(string(data), "\n") {
		if l == text {
			return i + 1
		}
	}
	t.Fatalf("%s has no line %q", file, text)
	return 0
}

func TestPositiveFull(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "positive", "full")
	c, err := catalog.Load(dir)
	require.NoError(t, err)

	// Groups are sorted by name, methods and fields keep file order.
	require.Len(t, c.Groups, 2)
	require.Equal(t, "extras", c.Groups[0].Name)
	require.Equal(t, "things", c.Groups[1].Name)
	require.Equal(t, filepath.Join(dir, "things.yaml"), c.Groups[1].File)
	var methods []string
	for _, m := range c.Methods() {
		methods = append(methods, m.FullName())
	}
	require.Equal(t, []string{"extras.ping", "extras.attach", "extras.getIamPolicy", "things.create", "things.list", "things.stats"}, methods)

	var shapes []string
	for _, s := range c.Shapes {
		shapes = append(shapes, s.Name)
	}
	require.Equal(t, []string{"TenantId", "ThingId", "Name", "IdemKey", "Cursor"}, shapes)
	require.Equal(t, 64, c.Shape("TenantId").MaxLength)
	require.Nil(t, c.Shape("Nope"))

	var codes []string
	for _, e := range c.Errors {
		codes = append(codes, fmt.Sprintf("%s=%d", e.Code, e.Status))
	}
	require.Equal(t, []string{"INVALID_INPUT=400", "NOT_FOUND=404", "CONFLICT=409", "NOT_IMPLEMENTED=501"}, codes)

	require.Len(t, c.Events, 1)
	require.Equal(t, "thing.created", c.Events[0].Type)
	require.Equal(t, []string{"thingId"}, fieldNames(c.Events[0].Payload))

	var types []string
	for _, nt := range c.NamedTypes() {
		types = append(types, nt.Group.Name+"."+nt.Name)
	}
	require.Equal(t, []string{"things.Mount", "things.Node", "extras.Owner", "things.Size", "things.Thing", "things.ThingList"}, types)

	create := c.Method("things.create")
	require.NotNil(t, create)
	require.Nil(t, c.Method("things.nope"))
	require.Equal(t, "/things/create", create.Route())
	require.True(t, create.Registered())
	require.Equal(t, "v0.1", create.Phase)
	require.Equal(t, catalog.KindMutation, create.Kind)
	require.Equal(t, "compute:things:manage", create.Action)
	require.True(t, create.Wait)
	require.Equal(t, []string{"thing.created"}, create.Events)
	require.Equal(t, []string{"INVALID_INPUT", "CONFLICT"}, create.Errors)
	require.Equal(t, "Creates a thing. This description is folded over two lines.", create.Description)
	things := filepath.Join(dir, "things.yaml")
	require.Equal(t, catalog.Pos{File: things, Line: lineOf(t, things, "  create:")}, create.Pos, "a method is where its name is written")

	// Field order is the file's order: the first problem is reported first.
	require.Equal(t, []string{
		"tenantId", "name", "kind", "projectId", "idempotencyKey", "size", "count", "ratio", "weight", "enabled",
		"labels", "tags", "extra", "config", "meta", "mounts", "matrix", "bySize", "sparse", "sparseMap", "spec",
		"rows", "note", "noteCount", "sizeOrNull", "tagsOrNull", "labelsOrNull", "anyOrNull", "metaOrNull",
		"specOrNull", "mustNote", "mustAny", "mustTags", "mustSize", "iamRegion", "sizeGiB", "ttlMs", "tree",
	}, fieldNames(create.Input))
	require.Equal(t, []string{"x", "y", "deep"}, fieldNames(create.Input.Field("spec").Schema))
	require.Equal(t, [][]string{{"x", "y"}}, create.Input.Field("spec").Schema.ExactlyOne)

	// Shapes resolve to strings with the shape's pattern and maxLength, and
	// a field may narrow them locally.
	tenant := create.Input.Field("tenantId").Schema
	require.Equal(t, catalog.TString, tenant.Type)
	require.Equal(t, "TenantId", tenant.Shape)
	require.Equal(t, "^[a-z0-9-]{1,64}$", tenant.Pattern)
	require.Equal(t, 64, *tenant.MaxLength)
	require.Equal(t, "Tenant identifier.", tenant.Description)
	require.True(t, tenant.Required)
	name := create.Input.Field("name").Schema
	require.Equal(t, "Name", name.Shape)
	require.Equal(t, 20, *name.MaxLength, "local maxLength overrides the shape's 63")
	require.Equal(t, "^[a-z][a-z0-9-]{0,62}$", name.Pattern, "the shape's pattern stays")
	project := create.Input.Field("projectId").Schema
	require.Equal(t, "Name", project.Shape)
	require.Equal(t, 40, *project.MaxLength)
	require.Equal(t, "^prj_[a-z0-9]+$", project.Pattern, "local pattern overrides the shape's")
	require.Equal(t, "^[a-z][a-z0-9-]{0,62}$", c.Shape("Name").Pattern, "overriding does not touch the shape")
	cursor := c.Method("things.list").Input.Field("cursor").Schema
	require.Equal(t, "Cursor", cursor.Shape)
	require.Equal(t, 256, *cursor.MaxLength, "a shape without maxLength takes the field's")
	require.Equal(t, "^[A-Za-z0-9]{1,256}$", cursor.Pattern)
	require.Equal(t, "Opaque cursor.", cursor.Description)

	// Defaults keep their YAML types.
	for field, want := range map[string]any{
		"kind": "custom", "count": 1, "ratio": 0.5, "weight": 2, "enabled": true,
		"labels": map[string]any{}, "tags": []any{}, "config": map[string]any{},
	} {
		s := create.Input.Field(field).Schema
		require.True(t, s.HasDefault, field)
		require.Equal(t, want, s.Default, field)
	}
	require.False(t, create.Input.Field("extra").Schema.HasDefault)
	limit := c.Method("things.list").Input.Field("limit").Schema
	require.Equal(t, 50, limit.Default)
	require.Equal(t, 1.0, *limit.Minimum)
	require.Equal(t, 50.0, *limit.Maximum)
	weight := create.Input.Field("weight").Schema
	require.Equal(t, -1.5, *weight.Minimum)
	require.Nil(t, weight.Maximum)

	// Containers.
	labels := create.Input.Field("labels").Schema
	require.Equal(t, catalog.TMap, labels.Type)
	require.Equal(t, "^[a-z]+$", labels.KeyPattern)
	require.Equal(t, 8, *labels.MaxEntries)
	require.Equal(t, 63, *labels.Values.MaxLength)
	matrix := create.Input.Field("matrix").Schema
	require.Equal(t, catalog.TArray, matrix.Items.Type)
	require.Equal(t, catalog.TInteger, matrix.Items.Items.Type)
	require.True(t, create.Input.Field("sparse").Schema.Items.Nullable)
	require.True(t, create.Input.Field("meta").Schema.FreeForm())
	require.False(t, create.Input.Field("spec").Schema.FreeForm())
	require.True(t, create.Input.Field("mustNote").Schema.Nullable)
	require.True(t, create.Input.Field("mustNote").Schema.Required)

	// Resource with alternates, idempotency.
	r := create.Resource
	require.Equal(t, "tenant", r.Type)
	require.Equal(t, "tenantId", r.ID)
	require.True(t, r.Draft)
	require.Equal(t, []string{"kind", "name"}, r.Attributes)
	require.Equal(t, []*catalog.Alternate{
		{Type: "fleet", ID: "global", WhenField: "kind", WhenIn: []string{"shared", "dedicated"}},
		{Type: "project", ID: "projectId", WhenField: "projectId"},
	}, r.Alternates)
	require.Equal(t, "tenant/tenantId alt=fleet/global when kind in shared|dedicated alt=project/projectId when projectId", r.String())
	require.Equal(t, &catalog.Idempotency{Key: "idempotencyKey", DerivesID: "thingId", Compare: []string{"kind", "name"}, IDPrefix: "thg"}, create.Idempotency)
	require.Equal(t, "tenant/tenantId items=thing", c.Method("things.list").Resource.String())
	attach := c.Method("extras.attach")
	require.Equal(t, "thing/thingId parent=tenant/tenantId", attach.Resource.String())
	require.False(t, attach.Registered())

	// Refs resolve across groups, in both directions and qualified or not.
	owner := c.Method("extras.ping").Output.Field("owner").Schema.Ref
	require.Equal(t, "Owner", owner.Name)
	require.Equal(t, "extras", owner.Group.Name)
	fav := owner.Schema.Field("favourite").Schema
	require.Equal(t, catalog.TObject, fav.Type)
	require.Equal(t, "Size", fav.Ref.Name, "extras sorts before things and still refers to its types")
	require.Equal(t, "things", fav.Ref.Group.Name)
	require.Equal(t, []string{"min", "max"}, fieldNames(fav), "Object goes through the ref")
	require.Equal(t, "Mount", owner.Schema.Field("spare").Schema.Ref.Name)
	require.Equal(t, "Mount", attach.Input.Field("mount").Schema.Ref.Name)
	require.Equal(t, "Thing", attach.Output.Ref.Name)
	require.Equal(t, "things", attach.Output.Ref.Group.Name)
	require.Equal(t, [][]string{{"machineId", "offerId"}}, attach.Input.ExactlyOne)
	require.Equal(t, "Owner", c.Method("things.create").Output.Object().Field("owner").Schema.Ref.Name)
	node := create.Input.Field("tree").Schema.Ref
	require.Same(t, node, node.Schema.Field("children").Schema.Items.Ref, "a type may refer to itself")
	mount := attach.Input.Field("mount").Schema.Ref
	require.Equal(t, [][]string{{"volumeId", "name"}}, mount.Schema.ExactlyOne)
	require.Equal(t, catalog.Pos{File: things, Line: lineOf(t, things, "  Mount:")}, mount.Pos)

	// Public methods have no action and no resource; inputs are never nil.
	ping := c.Method("extras.ping")
	require.Equal(t, catalog.KindPublic, ping.Kind)
	require.Empty(t, ping.Action)
	require.Nil(t, ping.Resource)
	require.NotNil(t, ping.Input.Fields)
	require.Empty(t, ping.Input.Fields)
	require.Nil(t, ping.Output.Ref)
	require.Equal(t, []string{"ok", "owner"}, fieldNames(ping.Output))
	stats := c.Method("things.stats")
	require.Equal(t, "fleet/global", stats.Resource.String())
	require.Equal(t, "Counts.", stats.Output.Description)
}

func TestPositiveMinimal(t *testing.T) {
	t.Parallel()
	c, err := catalog.Load(filepath.Join("testdata", "positive", "minimal"))
	require.NoError(t, err)
	require.Empty(t, c.Shapes)
	require.Empty(t, c.Events)
	require.Len(t, c.Groups, 1)
	m := c.Method("health.check")
	require.NotNil(t, m)
	require.False(t, m.Registered())
	require.Equal(t, "none", m.Phase)
	require.NotNil(t, m.Output.Fields)
	require.Empty(t, m.Output.Fields)
}

// A group may live in <group>.methods.yaml, beside a file of the same name
// that is not a group: the events group next to the event catalog.
func TestPositiveMethodsFile(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "positive", "methods_file")
	c, err := catalog.Load(dir)
	require.NoError(t, err)
	require.Len(t, c.Groups, 1)
	require.Equal(t, "events", c.Groups[0].Name)
	require.Equal(t, filepath.Join(dir, "events.methods.yaml"), c.Groups[0].File)
	m := c.Method("events.list")
	require.NotNil(t, m)
	require.Equal(t, "/events/list", m.Route())
	require.Equal(t, "v1.1", m.Phase)
	require.Len(t, c.Events, 1, "events.yaml is still the event catalog")
	require.Equal(t, "thing.created", c.Events[0].Type)
}

func TestNegativeGroupDefinedTwiceNamesTheOtherFile(t *testing.T) {
	t.Parallel()
	_, err := catalog.Load(filepath.Join("testdata", "negative", "group_defined_twice"))
	require.ErrorContains(t, err, filepath.Join("testdata", "negative", "group_defined_twice", "things.methods.yaml"))
}

// TestRealCatalog loads catalog/ and checks that every method and type is
// placed on the line that names it.
func TestRealCatalog(t *testing.T) {
	t.Parallel()
	c, err := catalog.Load(filepath.Join("..", "..", "..", "catalog"))
	require.NoError(t, err)
	require.NotEmpty(t, c.Methods())
	lines := map[string][]string{}
	text := func(p catalog.Pos) string {
		if lines[p.File] == nil {
			data, err := os.ReadFile(p.File)
			require.NoError(t, err)
			lines[p.File] = strings.Split(string(data), "\n")
		}
		return lines[p.File][p.Line-1]
	}
	for _, m := range c.Methods() {
		require.Equal(t, "  "+m.Name+":", text(m.Pos), m.FullName())
		for _, f := range m.Input.Fields {
			require.True(t, strings.HasPrefix(text(f.Schema.Pos), "      "+f.Name+":"), "%s.%s at %s", m.FullName(), f.Name, f.Schema.Pos)
		}
	}
	for _, nt := range c.NamedTypes() {
		require.Equal(t, "  "+nt.Name+":", text(nt.Pos), nt.Name)
	}
}
