package cligen

import (
	"go/format"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/tools/catalogc/catalog"
)

const (
	repoCatalog = "../../../catalog"
	testCatalog = "../testdata/catalog"
	fullCatalog = "../catalog/testdata/positive/full"
)

func load(t *testing.T, dir string) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Load(dir)
	require.NoError(t, err)
	return c
}

func render(t *testing.T, dir string) string {
	t.Helper()
	files, err := Files(load(t, dir))
	require.NoError(t, err)
	require.Len(t, files, 1)
	return string(files[FileName])
}

var space = regexp.MustCompile(`\s+`)

func flat(s string) string { return space.ReplaceAllString(strings.TrimSpace(s), " ") }

func requireSnippets(t *testing.T, src string, snippets ...string) {
	t.Helper()
	text := flat(src)
	for _, s := range snippets {
		if !strings.Contains(text, flat(s)) {
			t.Errorf("generated source lacks:\n%s", s)
		}
	}
}

func TestKebab(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"tenantId":          "tenant-id",
		"idempotencyKey":    "idempotency-key",
		"iamRegion":         "iam-region",
		"clearIamRegion":    "clear-iam-region",
		"sizeGiB":           "size-gib",
		"minMemoryGiB":      "min-memory-gib",
		"previousSizeGiB":   "previous-size-gib",
		"defaultTtlSeconds": "default-ttl-seconds",
		"callbackURL":       "callback-url",
		"HTTPServer":        "http-server",
		"accountIds":        "account-ids",
		"name63":            "name63",
		"v2Name":            "v2-name",
		"url":               "url",
		"x":                 "x",
	} {
		assert.Equal(t, want, Kebab(in), in)
	}
}

func TestOnlyRegisteredMethods(t *testing.T) {
	t.Parallel()
	cmds, err := Commands(load(t, testCatalog))
	require.NoError(t, err)
	var names []string
	for _, c := range cmds {
		names = append(names, c.Method.FullName())
	}
	// things.archive is planned.
	assert.Equal(t, []string{"things.create", "things.get", "things.ping"}, names)

	src := render(t, testCatalog)
	assert.NotContains(t, src, "archive")
	assert.NotContains(t, src, "ThingsArchive")

	// Groups sort by name.
	src = flat(render(t, fullCatalog))
	assert.Less(t, strings.Index(src, `Name: "extras"`), strings.Index(src, `Name: "things"`))
	assert.Positive(t, strings.Index(src, `Name: "extras"`))
}

func TestFlags(t *testing.T) {
	t.Parallel()
	c := load(t, testCatalog)
	flags, err := Flags(c.Method("things.create"))
	require.NoError(t, err)
	byField := map[string]Flag{}
	var order []string
	for _, f := range flags {
		byField[f.Field] = f
		order = append(order, f.Name)
	}
	assert.Equal(t, []string{
		"tenant-id", "name", "idempotency-key", "size", "ratio", "retries", "network", "note", "url",
		"warm", "env", "tags", "volumes", "labels", "config", "extra", "machine-id", "offer-id",
	}, order, "catalog order")
	assert.Equal(t, Flag{Name: "tenant-id", Field: "tenantId", Type: TypeString, Required: true, Help: "Tenant identifier."}, byField["tenantId"])
	assert.Equal(t, Flag{Name: "size", Field: "size", Type: TypeInt, Default: "10"}, byField["size"])
	assert.Equal(t, TypeNumber, byField["ratio"].Type)
	assert.Equal(t, Flag{Name: "network", Field: "network", Type: TypeString, Enum: []string{"egress", "private", "none"}}, byField["network"])
	assert.Equal(t, Flag{Name: "note", Field: "note", Type: TypeString, Nullable: true}, byField["note"])
	// Objects, refs, maps, arrays and any are JSON; a ref without a
	// description shows its type's.
	assert.Equal(t, Flag{Name: "warm", Field: "warm", Type: TypeJSON, Help: "Warm pool bounds."}, byField["warm"])
	for _, f := range []string{"env", "tags", "volumes", "labels", "config"} {
		assert.Equal(t, TypeJSON, byField[f].Type, f)
	}
	assert.Equal(t, Flag{Name: "extra", Field: "extra", Type: TypeJSON, Default: "{}"}, byField["extra"])

	flags, err = Flags(load(t, fullCatalog).Method("things.create"))
	require.NoError(t, err)
	for _, f := range flags {
		switch f.Field {
		case "kind":
			assert.Equal(t, "custom", f.Default, "a string default as it is")
		case "ratio":
			assert.Equal(t, "0.5", f.Default)
		case "enabled":
			assert.Equal(t, Flag{Name: "enabled", Field: "enabled", Type: TypeBool, Default: "true"}, f)
		}
	}
}

func TestFlagCollisions(t *testing.T) {
	t.Parallel()
	method := func(fields ...string) *catalog.Method {
		in := &catalog.Schema{Type: catalog.TObject, Fields: []*catalog.Field{}}
		for _, f := range fields {
			in.Fields = append(in.Fields, &catalog.Field{Name: f, Schema: &catalog.Schema{Type: catalog.TString}})
		}
		return &catalog.Method{Group: &catalog.Group{Name: "things"}, Name: "make", Input: in,
			Pos: catalog.Pos{File: "things.yaml", Line: 7}}
	}
	_, err := Flags(method("sizeGiB", "sizeGib"))
	require.EqualError(t, err, "things.yaml:7: things.make: input fields sizeGiB and sizeGib would both be the flag --size-gib")
	_, err = Flags(method("help"))
	require.EqualError(t, err, "things.yaml:7: things.make: input field help would be the flag --help, which computectl keeps for help")
	_, err = Flags(method("h"))
	require.Error(t, err)
	// A global flag's name is allowed: the method's flag wins after its name.
	flags, err := Flags(method("url", "output"))
	require.NoError(t, err)
	assert.Len(t, flags, 2)

	m := method("x")
	m.Status = catalog.StatusRegistered
	m.Group = &catalog.Group{Name: "help", File: "help.yaml", Methods: []*catalog.Method{m}}
	_, err = Commands(&catalog.Catalog{Groups: []*catalog.Group{m.Group}})
	require.EqualError(t, err, "help.yaml: group help would hide computectl help")
}

func TestFileFragments(t *testing.T) {
	t.Parallel()
	src := render(t, testCatalog)
	require.True(t, strings.HasPrefix(src, "// Code generated by catalogc from catalog/*.yaml. DO NOT EDIT.\n\n"), src[:80])
	formatted, err := format.Source([]byte(src))
	require.NoError(t, err)
	require.Equal(t, string(formatted), src, "gofmt'd")

	requireSnippets(t, src,
		"package cli",
		`cliruntime "computeplane/internal/cli"`,
		`"computeplane/gen/client"`,
		"var Groups = []cliruntime.Group{",
		`{
			Name:        "things",
			Description: "Things for tests.",
			Methods: []cliruntime.Method{
				{
					Name:        "create",
					Description: "Creates a thing. It has a second sentence.",
					Kind:        "mutation",
					Action:      "compute:things:manage",
					IDField:     "thingId",
					Flags: []cliruntime.Flag{
						{Name: "tenant-id", Field: "tenantId", Type: cliruntime.String, Required: true, Help: "Tenant identifier."},`,
		`{Name: "size", Field: "size", Type: cliruntime.Int, Default: "10"},`,
		`{Name: "ratio", Field: "ratio", Type: cliruntime.Number},`,
		`{Name: "network", Field: "network", Type: cliruntime.String, Enum: []string{"egress", "private", "none"}},`,
		`{Name: "note", Field: "note", Type: cliruntime.String, Nullable: true},`,
		`{Name: "warm", Field: "warm", Type: cliruntime.JSON, Help: "Warm pool bounds."},`,
		`{Name: "extra", Field: "extra", Type: cliruntime.JSON, Default: "{}"},`,
		`{Name: "machine-id", Field: "machineId", Type: cliruntime.String},`,
		// Each command calls its typed method of the generated client.
		`Call: func(ctx context.Context, c *client.Client) error {
			_, err := c.ThingsCreate(ctx, new(client.ThingsCreateInput))
			return err
		},`,
		// A public method: no action, no flags.
		`{
			Name:        "ping",
			Description: "Answers pong; no credential needed.",
			Kind:        "public",
			IDField:     "thingId",
			Call: func(ctx context.Context, c *client.Client) error {
				_, err := c.ThingsPing(ctx, new(client.ThingsPingInput))
				return err
			},
		},`,
	)

	// Deterministic.
	assert.Equal(t, src, render(t, testCatalog))
}

func TestRepoCatalog(t *testing.T) {
	t.Parallel()
	c := load(t, repoCatalog)
	src := render(t, repoCatalog)
	for _, g := range c.Groups {
		served := false
		for _, m := range g.Methods {
			served = served || m.Registered()
		}
		// A group whose methods are all planned is left out.
		assert.Equal(t, served, strings.Contains(flat(src), `Name: "`+g.Name+`", Description:`), g.Name)
	}
	for _, m := range c.Methods() {
		call := "c." + m.TypeName() + "(ctx, new(client." + m.TypeName() + "Input))"
		if m.Registered() {
			assert.Contains(t, src, call, m.FullName())
		} else {
			assert.NotContains(t, src, call, m.FullName())
		}
	}
}

// -q prints the object's own id: for every group of the repository's
// catalog, what its get and list answer (each item of a list) is known by.
// A group added to the catalog must be added here.
func TestIDFieldOfEveryGroup(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"events": "", "flavors": "name", "images": "imageId", "instances": "instanceId", "nodes": "nodeId",
		"pools": "poolId", "profiles": "profileId", "projects": "projectId", "providerAccounts": "accountId",
		"quotas": "", "reservations": "reservationId", "sandboxSnapshots": "snapshotId", "supportBundles": "bundleId",
		"sandboxTemplates": "templateId", "sandboxVolumes": "volumeId", "sandboxes": "sandboxId",
		"secrets": "name", "sites": "siteId", "system": "", "tunnels": "tunnelId", "usage": "", "webhooks": "webhookId",
		"workflows": "workflowId",
	}
	cmds, err := Commands(load(t, repoCatalog))
	require.NoError(t, err)
	groups := map[string]bool{}
	for _, c := range cmds {
		g := c.Method.Group.Name
		groups[g] = true
		id, ok := want[g]
		require.Truef(t, ok, "group %s: add its id field to this test", g)
		if c.Method.Name == "get" || c.Method.Name == "list" {
			assert.Equal(t, id, c.IDField, c.Method.FullName())
		}
	}
	assert.Len(t, groups, len(want))
}

// --wait of a method with wait { timeoutMs } is a Wait flag.
func TestWaitFlag(t *testing.T) {
	t.Parallel()
	c := load(t, repoCatalog)
	n := 0
	for _, m := range c.Methods() {
		flags, err := Flags(m)
		require.NoError(t, err)
		for _, f := range flags {
			if f.Field == "wait" {
				assert.Equal(t, TypeWait, f.Type, m.FullName())
				n++
			}
		}
	}
	assert.GreaterOrEqual(t, n, 8)
}
