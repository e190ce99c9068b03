package catalog_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/tools/catalogc/catalog"
)

// pluginGroup is a valid group of plugin "demo" with one line to replace.
const pluginGroup = `group: things
plugin: demo
methods:
  touch:
    phase: none
    status: registered
    kind: mutation
    action: compute:demo:write
    resource: {type: tenant, id: tenantId}
    events: [demo.thing.touched]
    description: Touches a thing.
    input:
      tenantId: {type: string, required: true}
    output: {fields: {ok: {type: boolean, required: true}}}
`

const pluginEvents = `demo.thing.touched:
  subject: thing
  module: demo
  description: Touched.
`

// writePlugin lays out plugins/<id>/catalog with files and returns its
// catalog directory.
func writePlugin(t *testing.T, id string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "plugins", id, "catalog")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	return dir
}

func TestPluginCatalog(t *testing.T) {
	t.Parallel()
	main := filepath.Join("testdata", "positive", "minimal")
	c, err := catalog.Load(main, writePlugin(t, "demo", map[string]string{"things.yaml": pluginGroup, "events.yaml": pluginEvents}))
	require.NoError(t, err)
	m := c.Method("demo.things.touch")
	require.NotNil(t, m)
	require.Equal(t, "/plugins/demo/things/touch", m.Route())
	require.Equal(t, "DemoThings", m.Group.TypeName())
	require.Equal(t, "demoThingsTouch", m.OperationID())
	require.Equal(t, "demo", c.Event("demo.thing.touched").Plugin)
}

func TestPluginCatalogRefusals(t *testing.T) {
	t.Parallel()
	main := filepath.Join("testdata", "positive", "minimal")
	replace := func(old, new string) string {
		out := pluginGroup
		for i := 0; i+len(old) <= len(out); i++ {
			if out[i:i+len(old)] == old {
				return out[:i] + new + out[i+len(old):]
			}
		}
		t.Fatalf("%q not in the group", old)
		return ""
	}
	for name, tc := range map[string]struct {
		id, group, events, msg string
	}{
		"no plugin key":  {"demo", replace("plugin: demo\n", ""), pluginEvents, "must say plugin: demo"},
		"other plugin":   {"demo", replace("plugin: demo", "plugin: other"), pluginEvents, `does not match the plugin directory "demo"`},
		"action outside": {"demo", replace("compute:demo:write", "compute:things:write"), pluginEvents, "must begin compute:demo:"},
		"public":         {"demo", replace("kind: mutation", "kind: public"), pluginEvents, "public method"},
		"event outside":  {"demo", replace("[demo.thing.touched]", "[site.created]"), pluginEvents + "site.created: {subject: s, module: demo}\n", `"site.created" of plugin demo must start with demo.`},
		"event module":   {"demo", pluginGroup, "demo.thing.touched: {subject: s, module: sites}\n", "must name module demo"},
		"bad id":         {"Demo-1", pluginGroup, pluginEvents, "plugin id"},
		"idempotency":    {"demo", replace("    events:", "    idempotency: {key: tenantId}\n    events:"), pluginEvents, "idempotency keys are not offered"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := writePlugin(t, tc.id, map[string]string{"things.yaml": tc.group, "events.yaml": tc.events})
			_, err := catalog.Load(main, dir)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
	// A plugin's group in the service's own catalog is refused too.
	dir := t.TempDir()
	for _, f := range []string{"shapes.yaml", "errors.yaml"} {
		b, err := os.ReadFile(filepath.Join(main, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "things.yaml"), []byte(pluginGroup), 0o644))
	_, err := catalog.Load(dir)
	require.ErrorContains(t, err, "a plugin's groups live in plugins/demo/catalog")
}
