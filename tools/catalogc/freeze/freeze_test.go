package freeze

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/tools/catalogc/catalog"
)

const (
	testCatalog = "../testdata/catalog"
	repoCatalog = "../../../catalog"
	repoSurface = "../../../" + File
)

// load loads dir, with the repository's plugin catalogs when dir is the
// repository's catalog: their served surface is frozen with it.
func load(t *testing.T, dir string) *catalog.Catalog {
	t.Helper()
	glob := ""
	if dir == repoCatalog {
		glob = "../../../" + catalog.PluginsGlob
	}
	c, err := catalog.LoadWithPlugins(dir, glob)
	require.NoError(t, err)
	return c
}

// frozenFile is the surface file "catalogc freeze" would write, as lines.
func frozenFile(c *catalog.Catalog) []string { return Parse(Format(Record(nil, c))) }

// field finds the schema at a dotted input path of a method ("warm.min",
// "volumes[].mountPath", "env{}").
func field(t *testing.T, c *catalog.Catalog, method, path string) *catalog.Schema {
	t.Helper()
	m := c.Method(method)
	require.NotNil(t, m, method)
	s := m.Input
	for _, seg := range strings.Split(path, ".") {
		name := strings.TrimRight(seg, "[]{}")
		f := s.Field(name)
		require.NotNil(t, f, "%s: no field %s", method, path)
		s = f.Schema
		for rest := seg[len(name):]; rest != ""; rest = rest[2:] {
			if strings.HasPrefix(rest, "[]") {
				s = s.Items
			} else {
				s = s.Values
			}
		}
	}
	return s
}

func removeField(t *testing.T, c *catalog.Catalog, method, name string) {
	t.Helper()
	in := c.Method(method).Input
	for i, f := range in.Fields {
		if f.Name == name {
			in.Fields = append(in.Fields[:i], in.Fields[i+1:]...)
			return
		}
	}
	t.Fatalf("%s has no input field %s", method, name)
}

func ptr[T any](v T) *T { return &v }

func TestSurfaceLines(t *testing.T) {
	s := Surface(load(t, testCatalog))
	for _, want := range []string{
		`method things.create route=/things/create kind=mutation action=compute:things:manage resource=tenant/tenantId`,
		`method things.ping route=/things/ping kind=public action=null resource=none`,
		`field things.create.input type=object required=true exactlyOne=machineId|offerId`,
		`field things.create.input.name type=string required=true maxLength=63 pattern=^[a-z0-9][a-z0-9._-]{0,62}$`,
		`field things.create.input.size type=integer required=false minimum=1 maximum=100`,
		`field things.create.input.network type=string required=false enum=egress,none,private`,
		`field things.create.input.note type=string required=false maxLength=256 nullable=true`,
		`field things.create.input.warm type=object required=false`,
		`field things.create.input.warm.min type=integer required=true minimum=0 maximum=64`,
		`field things.create.input.env type=map required=false maxEntries=64 keyPattern=^[A-Z_][A-Z0-9_]{0,63}$`,
		`field things.create.input.env{} type=string maxLength=1024`,
		`field things.create.input.tags type=array required=false minItems=1 maxItems=8`,
		`field things.create.input.tags[] type=string maxLength=32`,
		`field things.create.input.volumes[] type=object exactlyOne=volumeId|name`,
		`field things.create.input.volumes[].mountPath type=string required=true minLength=2 maxLength=255 pattern=^/[A-Za-z0-9._/-]{1,254}$`,
		`field things.create.input.config type=object{} required=false`,
		`field things.create.input.extra type=any required=false`,
		`error CONFLICT status=409`,
	} {
		assert.Contains(t, s, want)
	}
	for _, l := range s {
		assert.NotContains(t, l, "things.archive", "planned methods are not frozen")
		p, err := ParseLine(l)
		require.NoError(t, err, l)
		assert.Equal(t, l, format(p.Kind, p.Key, pairs(p)...), "lines round-trip")
	}
	assert.IsNonDecreasing(t, s)
}

func pairs(l *Line) []string {
	var out []string
	for _, k := range l.Order {
		out = append(out, k, l.Attrs[k])
	}
	return out
}

func TestParseLineQuoted(t *testing.T) {
	l := format(KindMethod, "a.b", "route", "/a/b", "resource", "tenant/tenantId alt=fleet/global when kind in x|y", "action", "")
	assert.Equal(t, `method a.b route=/a/b resource="tenant/tenantId alt=fleet/global when kind in x|y" action=""`, l)
	p, err := ParseLine(l)
	require.NoError(t, err)
	assert.Equal(t, "tenant/tenantId alt=fleet/global when kind in x|y", p.Attrs["resource"])
	assert.Equal(t, "", p.Attrs["action"])
	assert.Equal(t, []string{"route", "resource", "action"}, p.Order)
	for _, bad := range []string{"", "method", "thing a.b", "field a.b.input type", `field a.b x="open`, "field a.b x=1 x=2"} {
		_, err := ParseLine(bad)
		assert.Error(t, err, bad)
	}
}

func TestFormatAndParse(t *testing.T) {
	c := load(t, testCatalog)
	data := Format(Surface(c))
	lines := Parse(data)
	require.GreaterOrEqual(t, len(lines), 4)
	assert.Equal(t, strings.Split(strings.TrimSuffix(Header, "\n"), "\n"), lines[:3])
	assert.Len(t, strings.Split(strings.TrimSuffix(Header, "\n"), "\n"), 3)
	assert.Equal(t, Surface(c), features(lines))
	assert.Empty(t, Check(lines, c), "a fresh surface passes")
	assert.Equal(t, lines, Parse([]byte(strings.ReplaceAll(string(data), "\n", "\r\n"))))
}

func TestRecordOnlyAdds(t *testing.T) {
	c := load(t, testCatalog)
	old := []string{"# comment", "method gone.method route=/gone/method kind=read action=x resource=y"}
	rec := Record(old, c)
	assert.Contains(t, rec, old[1])
	assert.NotContains(t, rec, old[0])
	for _, l := range Surface(c) {
		assert.Contains(t, rec, l)
	}
	assert.IsNonDecreasing(t, rec)
	// Recording twice changes nothing.
	assert.Equal(t, rec, Record(Parse(Format(rec)), c))

	// A widened field keeps its old line next to the new one, and both pass.
	frozen := frozenFile(c)
	field(t, c, "things.create", "name").MaxLength = ptr(100)
	rec = Record(frozen, c)
	assert.Contains(t, rec, `field things.create.input.name type=string required=true maxLength=63 pattern=^[a-z0-9][a-z0-9._-]{0,62}$`)
	assert.Contains(t, rec, `field things.create.input.name type=string required=true maxLength=100 pattern=^[a-z0-9][a-z0-9._-]{0,62}$`)
	assert.Empty(t, Check(Parse(Format(rec)), c))
	field(t, c, "things.create", "name").MaxLength = ptr(80)
	assert.NotEmpty(t, Check(Parse(Format(rec)), c), "narrowing below the newest line still fails")
}

// Each rule of the Versioning section, proven to fail.
func TestNarrowingFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, c *catalog.Catalog)
		edit   func(lines []string) // edits the frozen file instead
		line   string               // the reported frozen line starts with this
		why    string
	}{
		{name: "served method removed", line: "method things.get ", why: "served method is gone",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				g := c.Groups[0]
				g.Methods = g.Methods[:1] // keeps create only
			}},
		{name: "served method planned again", line: "method things.get ", why: "no longer registered (status planned)",
			mutate: func(t *testing.T, c *catalog.Catalog) { c.Method("things.get").Status = catalog.StatusPlanned }},
		{name: "route changed", line: "method things.get ", why: "route changed from /things/fetch to /things/get",
			edit: func(lines []string) { replaceIn(lines, "route=/things/get", "route=/things/fetch") }},
		{name: "kind changed", line: "method things.get ", why: "kind changed from read to mutation",
			mutate: func(t *testing.T, c *catalog.Catalog) { c.Method("things.get").Kind = catalog.KindMutation }},
		{name: "action changed", line: "method things.get ", why: "action changed from compute:things:read to compute:things:admin",
			mutate: func(t *testing.T, c *catalog.Catalog) { c.Method("things.get").Action = "compute:things:admin" }},
		{name: "resource changed", line: "method things.create ", why: `resource changed from tenant/tenantId to "tenant/tenantId parent=pool/poolId"`,
			mutate: func(t *testing.T, c *catalog.Catalog) {
				c.Method("things.create").Resource.Parent = &catalog.ResourceRef{Type: "pool", ID: "poolId"}
			}},
		{name: "input field removed", line: "field things.create.input.note ", why: "input field is gone",
			mutate: func(t *testing.T, c *catalog.Catalog) { removeField(t, c, "things.create", "note") }},
		{name: "nested field removed", line: "field things.create.input.labels.team ", why: "input field is gone",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				s := field(t, c, "things.create", "labels")
				s.Fields = s.Fields[1:]
			}},
		{name: "type changed", line: "field things.create.input.size ", why: "type changed from integer to string",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				s := field(t, c, "things.create", "size")
				s.Type, s.Minimum, s.Maximum = catalog.TString, nil, nil
			}},
		{name: "became required", line: "field things.create.input.size ", why: "became required",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "size").Required = true }},
		{name: "nested field became required", line: "field things.create.input.warm.max ", why: "became required",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "warm.max").Required = true }},
		{name: "minLength raised", line: "field things.create.input.volumes[].mountPath ", why: "minLength raised from 2 to 3",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				field(t, c, "things.create", "volumes[].mountPath").MinLength = ptr(3)
			}},
		{name: "minLength added", line: "field things.create.input.name ", why: "minLength 5 was added",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").MinLength = ptr(5) }},
		{name: "minimum raised", line: "field things.create.input.size ", why: "minimum raised from 1 to 2",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "size").Minimum = ptr(2.0) }},
		{name: "minimum raised by a fraction", line: "field things.create.input.labels.cost ", why: "minimum raised from 0 to 0.5",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "labels.cost").Minimum = ptr(0.5) }},
		{name: "minimum added", line: "field things.create.input.retries ", why: "minimum 1 was added",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "retries").Minimum = ptr(1.0) }},
		{name: "minItems raised", line: "field things.create.input.tags ", why: "minItems raised from 1 to 2",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "tags").MinItems = ptr(2) }},
		{name: "maxLength lowered", line: "field things.create.input.name ", why: "maxLength lowered from 63 to 62",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").MaxLength = ptr(62) }},
		{name: "maxLength added", line: "field things.create.input.machineId ", why: "maxLength 128 was added",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "machineId").MaxLength = ptr(128) }},
		{name: "maximum lowered", line: "field things.create.input.warm.min ", why: "maximum lowered from 64 to 32",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "warm.min").Maximum = ptr(32.0) }},
		{name: "maximum added", line: "field things.create.input.ratio ", why: "maximum 1 was added",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "ratio").Maximum = ptr(1.0) }},
		{name: "maxItems lowered", line: "field things.create.input.volumes ", why: "maxItems lowered from 8 to 4",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "volumes").MaxItems = ptr(4) }},
		{name: "maxEntries lowered", line: "field things.create.input.env ", why: "maxEntries lowered from 64 to 10",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "env").MaxEntries = ptr(10) }},
		{name: "map value bound lowered", line: "field things.create.input.env{} ", why: "maxLength lowered from 1024 to 512",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "env{}").MaxLength = ptr(512) }},
		{name: "array item bound lowered", line: "field things.create.input.tags[] ", why: "maxLength lowered from 32 to 16",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "tags[]").MaxLength = ptr(16) }},
		{name: "pattern changed", line: "field things.create.input.name ", why: "pattern changed",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").Pattern = "^[a-z]{1,63}$" }},
		{name: "pattern added", line: "field things.create.input.idempotencyKey ", why: "pattern ^[a-z]+$ was added",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				field(t, c, "things.create", "idempotencyKey").Pattern = "^[a-z]+$"
			}},
		{name: "keyPattern changed", line: "field things.create.input.env ", why: "keyPattern changed",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "env").KeyPattern = "^[A-Z]+$" }},
		{name: "format added", line: "field things.create.input.idempotencyKey ", why: "format uuid was added",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "idempotencyKey").Format = "uuid" }},
		{name: "enum value lost", line: "field things.create.input.network ", why: "enum lost none",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				field(t, c, "things.create", "network").Enum = []string{"egress", "private"}
			}},
		{name: "enum added", line: "field things.create.input.machineId ", why: "enum a,b was added",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				field(t, c, "things.create", "machineId").Enum = []string{"b", "a"}
			}},
		{name: "no longer nullable", line: "field things.create.input.note ", why: "no longer nullable",
			mutate: func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "note").Nullable = false }},
		{name: "exactlyOne added", line: "field things.create.input.labels ", why: "exactlyOne team|cost was added",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				field(t, c, "things.create", "labels").ExactlyOne = [][]string{{"team", "cost"}}
			}},
		{name: "new required input field", line: "method things.create ", why: "new required input field input.region",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				in := c.Method("things.create").Input
				in.Fields = append(in.Fields, &catalog.Field{Name: "region", Schema: &catalog.Schema{Type: catalog.TString, Required: true}})
			}},
		{name: "new required nested field", line: "method things.create ", why: "new required input field input.warm.step",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				w := field(t, c, "things.create", "warm").Object()
				w.Fields = append(w.Fields, &catalog.Field{Name: "step", Schema: &catalog.Schema{Type: catalog.TInteger, Required: true}})
			}},
		{name: "error code removed", line: "error NOT_FOUND ", why: "error code is gone",
			mutate: func(t *testing.T, c *catalog.Catalog) {
				c.Errors = append(c.Errors[:1:1], c.Errors[2:]...)
			}},
		{name: "error status changed", line: "error CONFLICT ", why: "HTTP status changed from 409 to 400",
			mutate: func(t *testing.T, c *catalog.Catalog) { c.ErrorCode("CONFLICT").Status = 400 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, testCatalog)
			lines := frozenFile(c)
			if tc.edit != nil {
				tc.edit(lines)
			}
			if tc.mutate != nil {
				tc.mutate(t, c)
			}
			vs := Check(lines, c)
			require.NotEmpty(t, vs, "the change must fail the check")
			found := false
			for _, v := range vs {
				assert.Equal(t, strings.TrimSpace(lines[v.Line-1]), v.Text, "a violation names its line")
				if strings.HasPrefix(v.Text, tc.line) && strings.Contains(v.Why, tc.why) {
					found = true
				}
			}
			assert.True(t, found, "want %q on %q, got %v", tc.why, tc.line, vs)
		})
	}
}

func replaceIn(lines []string, old, new string) {
	for i, l := range lines {
		lines[i] = strings.Replace(l, old, new, 1)
	}
}

// A removed method is reported once, not once per field.
func TestGoneMethodReportedOnce(t *testing.T) {
	c := load(t, testCatalog)
	lines := frozenFile(c)
	c.Method("things.create").Status = catalog.StatusPlanned
	vs := Check(lines, c)
	require.Len(t, vs, 1)
	assert.True(t, strings.HasPrefix(vs[0].Text, "method things.create "))
	// Likewise a removed object field: its nested lines are not repeated.
	c = load(t, testCatalog)
	removeField(t, c, "things.create", "warm")
	vs = Check(lines, c)
	require.Len(t, vs, 1, "%v", vs)
	assert.True(t, strings.HasPrefix(vs[0].Text, "field things.create.input.warm "))
}

func TestWideningPasses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, c *catalog.Catalog)
	}{
		{"maxLength raised", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").MaxLength = ptr(128) }},
		{"maxLength dropped", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "note").MaxLength = nil }},
		{"minLength lowered", func(t *testing.T, c *catalog.Catalog) {
			field(t, c, "things.create", "volumes[].mountPath").MinLength = ptr(1)
		}},
		{"minimum lowered and maximum raised", func(t *testing.T, c *catalog.Catalog) {
			s := field(t, c, "things.create", "size")
			s.Minimum, s.Maximum = ptr(0.0), ptr(1000.0)
		}},
		{"minItems dropped and maxItems raised", func(t *testing.T, c *catalog.Catalog) {
			s := field(t, c, "things.create", "tags")
			s.MinItems, s.MaxItems = nil, ptr(16)
		}},
		{"maxEntries raised", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "env").MaxEntries = ptr(128) }},
		{"pattern dropped", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").Pattern = "" }},
		{"enum value added", func(t *testing.T, c *catalog.Catalog) {
			s := field(t, c, "things.create", "network")
			s.Enum = append(s.Enum, "public")
		}},
		{"enum dropped", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "network").Enum = nil }},
		{"became optional", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "name").Required = false }},
		{"became nullable", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "size").Nullable = true }},
		{"integer became number", func(t *testing.T, c *catalog.Catalog) { field(t, c, "things.create", "size").Type = catalog.TNumber }},
		{"object became any", func(t *testing.T, c *catalog.Catalog) {
			s := field(t, c, "things.create", "labels")
			s.Type, s.Fields = catalog.TAny, nil
		}},
		{"exactlyOne dropped", func(t *testing.T, c *catalog.Catalog) { c.Method("things.create").Input.ExactlyOne = nil }},
		{"new optional field", func(t *testing.T, c *catalog.Catalog) {
			in := c.Method("things.create").Input
			in.Fields = append(in.Fields, &catalog.Field{Name: "region", Schema: &catalog.Schema{Type: catalog.TString}})
		}},
		{"new optional object with a required field", func(t *testing.T, c *catalog.Catalog) {
			in := c.Method("things.create").Input
			in.Fields = append(in.Fields, &catalog.Field{Name: "limits", Schema: &catalog.Schema{Type: catalog.TObject,
				Fields: []*catalog.Field{{Name: "cpu", Schema: &catalog.Schema{Type: catalog.TInteger, Required: true}}}}})
		}},
		{"new method", func(t *testing.T, c *catalog.Catalog) { c.Method("things.archive").Status = catalog.StatusRegistered }},
		{"planned method changes freely", func(t *testing.T, c *catalog.Catalog) {
			m := c.Method("things.archive")
			m.Input.Fields = m.Input.Fields[:1]
			m.Kind, m.Action = catalog.KindRead, "compute:things:read"
			m.Input.Fields = append(m.Input.Fields, &catalog.Field{Name: "x", Schema: &catalog.Schema{Type: catalog.TString, Required: true}})
		}},
		{"new error code", func(t *testing.T, c *catalog.Catalog) {
			c.Errors = append(c.Errors, &catalog.ErrorCode{Code: "TEAPOT", Status: 418})
		}},
		{"output changed", func(t *testing.T, c *catalog.Catalog) {
			c.Method("things.get").Output = &catalog.Schema{Type: catalog.TObject, Fields: []*catalog.Field{}}
		}},
		{"description changed", func(t *testing.T, c *catalog.Catalog) {
			c.Method("things.create").Description = "Other words."
			field(t, c, "things.create", "name").Description = "Other words."
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, testCatalog)
			lines := frozenFile(c)
			tc.mutate(t, c)
			assert.Empty(t, Check(lines, c))
		})
	}
}

func TestUnreadableLine(t *testing.T) {
	c := load(t, testCatalog)
	lines := append(frozenFile(c), "nonsense here")
	vs := Check(lines, c)
	require.Len(t, vs, 1)
	assert.Equal(t, len(lines), vs[0].Line)
	assert.Contains(t, vs[0].Why, "unreadable")
}

// The real catalog: nested paths as the brief names them, on a method
// marked registered in memory.
func TestRepoNestedPaths(t *testing.T) {
	c := load(t, repoCatalog)
	m := c.Method("sandboxTemplates.create")
	if m == nil {
		t.Skip("sandboxTemplates.create is not in the catalog")
	}
	m.Status = catalog.StatusRegistered
	keys := map[string]bool{}
	for _, l := range Surface(c) {
		p, err := ParseLine(l)
		require.NoError(t, err)
		keys[p.Key] = true
	}
	for _, k := range []string{"input.warm.min", "input.volumes[].mountPath", "input.env{}"} {
		assert.True(t, keys["sandboxTemplates.create."+k], k)
	}
	lines := frozenFile(c)
	field(t, c, "sandboxTemplates.create", "warm.min").Maximum = ptr(8.0)
	assert.NotEmpty(t, Check(lines, c))
}

// TestFrozenSurface holds the repository to its committed surface.
func TestFrozenSurface(t *testing.T) {
	c := load(t, repoCatalog)
	data, err := os.ReadFile(repoSurface)
	require.NoError(t, err, "run go run ./tools/catalogc freeze")
	lines := Parse(data)
	for _, v := range Check(lines, c) {
		t.Errorf("%s:%d: %s: %s", File, v.Line, v.Text, v.Why)
	}
	// Every served method is recorded (freeze was run after registering).
	recorded := map[string]bool{}
	for _, l := range features(lines) {
		recorded[l] = true
	}
	for _, l := range Surface(c) {
		if (strings.HasPrefix(l, KindMethod+" ") || strings.HasPrefix(l, KindError+" ")) && !recorded[l] {
			t.Errorf("not frozen yet, run go run ./tools/catalogc freeze: %s", l)
		}
	}
}
