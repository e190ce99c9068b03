package profiles

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/workflows"
)

const good = `{
  "id": "web", "version": 3, "description": "a web host",
  "requires": ["power", "boot", "media", "agent", "inventory"],
  "image": "computeplane/minimal", "userData": "#cloud-config\n",
  "hostConfig": {"hostname": "web-1", "kernelArgs": ["console=ttyS0"], "sysctl": {"net.ipv4.ip_forward": "1"}},
  "steps": [
    {"name": "off", "phase": "prepare", "uses": "power.off"},
    {"name": "media", "phase": "prepare", "uses": "media.insert", "with": {"slot": "usb", "image": "${image}"}, "timeoutSeconds": 30, "retries": 2},
    {"name": "base", "phase": "provision", "uses": "profile:base@1"},
    {"name": "write", "phase": "provision", "uses": "image.write", "with": {"image": "${image}"}},
    {"name": "join", "phase": "verify", "uses": "node.join"}
  ]
}`

func TestCheckAcceptsADocument(t *testing.T) {
	t.Parallel()
	d, issues := CheckJSON([]byte(good))
	require.Empty(t, issues)
	assert.Equal(t, "web", d.ID)
	assert.Equal(t, 3, d.Version)
	assert.Len(t, d.Steps, 5)
	assert.Equal(t, "web-1", d.HostConfig.Hostname)
	id, v, ok := UsesProfile(d.Steps[2].Uses)
	assert.True(t, ok)
	assert.Equal(t, "base", id)
	assert.Equal(t, 1, v)
}

// edit returns the good document with change applied to its decoded map.
func edit(t *testing.T, change func(m map[string]any)) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(good), &m))
	change(m)
	return m
}

func step(m map[string]any, i int) map[string]any { return m["steps"].([]any)[i].(map[string]any) }

func TestCheckNamesTheFirstOffendingField(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		change func(m map[string]any)
		path   string
		word   string
	}{
		"no id":                  {func(m map[string]any) { delete(m, "id") }, "id", "required"},
		"a bad id":               {func(m map[string]any) { m["id"] = "Web!" }, "id", "match"},
		"version 0":              {func(m map[string]any) { m["version"] = 0 }, "version", "minimum"},
		"version too high":       {func(m map[string]any) { m["version"] = 1000001 }, "version", "maximum"},
		"an unknown field":       {func(m map[string]any) { m["drivers"] = []any{} }, "drivers", "not a field"},
		"a bad capability":       {func(m map[string]any) { m["requires"] = []any{"teleport"} }, "requires[0]", ""},
		"a long userData":        {func(m map[string]any) { m["userData"] = strings.Repeat("x", 32769) }, "userData", ""},
		"a bad hostname":         {func(m map[string]any) { m["hostConfig"].(map[string]any)["hostname"] = "Web_1" }, "hostConfig.hostname", ""},
		"no steps":               {func(m map[string]any) { m["steps"] = []any{} }, "steps", ""},
		"a step without a phase": {func(m map[string]any) { delete(step(m, 1), "phase") }, "steps[1].phase", "required"},
		"an unknown phase":       {func(m map[string]any) { step(m, 1)["phase"] = "deploy" }, "steps[1].phase", ""},
		"a bad uses":             {func(m map[string]any) { step(m, 0)["uses"] = "Power On" }, "steps[0].uses", ""},
		"with on a profile use":  {func(m map[string]any) { step(m, 2)["with"] = map[string]any{} }, "steps[2].with", "profile"},
		"retries on a profile":   {func(m map[string]any) { step(m, 2)["retries"] = 1 }, "steps[2].retries", "profile"},
		"a zero timeout":         {func(m map[string]any) { step(m, 1)["timeoutSeconds"] = 0 }, "steps[1].timeoutSeconds", ""},
		"too many retries":       {func(m map[string]any) { step(m, 1)["retries"] = 11 }, "steps[1].retries", ""},
		"a duplicate name":       {func(m map[string]any) { step(m, 3)["name"] = "off" }, "steps[3].name", "steps[0]"},
		"a phase going back":     {func(m map[string]any) { step(m, 3)["phase"] = "prepare" }, "steps[3].phase", "after provision"},
		"two problems, the first in document order": {func(m map[string]any) {
			step(m, 4)["phase"] = "x"
			m["version"] = "three"
		}, "version", ""},
	} {
		_, issues := Check(edit(t, c.change))
		require.NotEmpty(t, issues, name)
		assert.Equal(t, c.path, issues[0].Path, name)
		assert.Contains(t, issues[0].Message, c.word, name)
	}
}

func TestCheckTakesIntegersWrittenAsDecimals(t *testing.T) {
	t.Parallel()
	d, issues := CheckJSON([]byte(`{"id":"a","version":1.0,"steps":[{"name":"x","phase":"prepare","uses":"power.on","timeoutSeconds":3e1,"retries":2.0}]}`))
	require.Empty(t, issues)
	assert.Equal(t, 1, d.Version)
	assert.Equal(t, 30, *d.Steps[0].TimeoutSeconds)
}

func TestCheckReturnsEveryIssue(t *testing.T) {
	t.Parallel()
	_, issues := Check(edit(t, func(m map[string]any) {
		delete(m, "id")
		step(m, 0)["phase"] = "x"
		step(m, 1)["retries"] = -1
	}))
	var paths []string
	for _, is := range issues {
		paths = append(paths, is.Path)
	}
	assert.Equal(t, []string{"id", "steps[0].phase", "steps[1].retries"}, paths)
}

func TestBuiltinsResolve(t *testing.T) {
	t.Parallel()
	require.NotEmpty(t, builtins)
	for i := range builtins {
		b := &builtins[i]
		if hasProfileUse(b.d) {
			continue // needs the store's lookup: the end-to-end tests render it
		}
		steps, issues, err := Resolve(context.Background(), nil, "acme", builtinEntry(b))
		require.NoError(t, err)
		assert.Empty(t, issues, "%s@%d", b.d.ID, b.d.Version)
		assert.NotEmpty(t, steps)
	}
}

func hasProfileUse(d *Document) bool {
	for _, s := range d.Steps {
		if _, _, ok := UsesProfile(s.Uses); ok {
			return true
		}
	}
	return false
}

// The shipped metal-host document is the profile the workflow engine
// declares in Go (workflows.Builtin): either may answer for it.
func TestMetalHostIsTheEnginesProfile(t *testing.T) {
	t.Parallel()
	mine, issues, err := Resolve(context.Background(), nil, "acme", builtinEntry(findBuiltin("metal-host", 1)))
	require.NoError(t, err)
	require.Empty(t, issues)
	theirs, err := workflows.Builtin{}.Render(context.Background(), nil, "acme", workflows.MetalHostProfile, 1)
	require.NoError(t, err)
	require.Len(t, mine, len(theirs.Steps))
	for i, s := range theirs.Steps {
		want, _ := json.Marshal(s)
		got, _ := json.Marshal(workflows.Step{Name: mine[i].Name, Phase: mine[i].Phase, Uses: mine[i].Uses, With: mine[i].With,
			TimeoutMs: mine[i].TimeoutMs, Retries: mine[i].Retries})
		assert.JSONEq(t, string(want), string(got), "step %d", i)
	}
}

func TestResolveChecksWithAgainstTheAction(t *testing.T) {
	t.Parallel()
	doc := edit(t, func(m map[string]any) {
		m["steps"] = []any{
			map[string]any{"name": "a", "phase": "prepare", "uses": "media.insert", "with": map[string]any{"slot": "floppy", "extra": 1}},
			map[string]any{"name": "b", "phase": "prepare", "uses": "power.jump"},
			map[string]any{"name": "c", "phase": "verify", "uses": "console.read", "with": map[string]any{"bytes": 1.5}},
			map[string]any{"name": "d", "phase": "verify", "uses": "profile:x@2000000"},
		}
		m["requires"] = []any{"media"}
	})
	_, issues, err := Resolve(context.Background(), nil, "acme", &Entry{Tenant: "acme", ID: "web", Version: 3, Document: doc})
	require.NoError(t, err)
	var got []string
	for _, is := range issues {
		got = append(got, is.Path)
	}
	assert.Equal(t, []string{"steps[0].with.extra", "steps[0].with.image", "steps[0].with.slot", "steps[1].uses",
		"steps[2].uses", "steps[2].with.bytes", "steps[3].uses"}, got, fmt.Sprint(issues))
}

func TestPositionRoundTrip(t *testing.T) {
	t.Parallel()
	p := position{id: strings.Repeat("a", 128), version: 1000000, skip: 7}
	q, ok := decodePosition(p.encode())
	require.True(t, ok)
	assert.Equal(t, p, q)
	_, ok = decodePosition([]byte{1, 2})
	assert.False(t, ok)
}

// FuzzCheck: the document checker never panics, and a document it accepts
// has an id, a version in range and steps with known phases, and checks
// again the same once re-encoded.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"id":"a","version":1,"steps":[{"name":"x","phase":"prepare","uses":"profile:a@1"}]}`))
	f.Add([]byte(`{"id":"a","version":1,"steps":[{"name":"x","phase":"verify","uses":"power.on"},{"name":"x","phase":"prepare","uses":"y"}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"id":"a","version":1.0,"steps":[{"name":"x","phase":"prepare","uses":"power.on","retries":1e0}]}`))
	f.Add([]byte(`{"steps":[{}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, issues := CheckJSON(raw)
		if len(issues) > 0 {
			require.Nil(t, d)
			return
		}
		require.NotNil(t, d)
		require.NotEmpty(t, d.ID)
		require.True(t, d.Version >= 1 && d.Version <= 1000000)
		require.NotEmpty(t, d.Steps)
		for _, s := range d.Steps {
			require.Contains(t, Phases, s.Phase)
		}
		again, err := json.Marshal(d)
		require.NoError(t, err)
		_, issues = CheckJSON(again)
		require.Empty(t, issues, string(again))
	})
}
