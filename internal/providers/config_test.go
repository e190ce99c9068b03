package providers_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/providers"
	"computeplane/internal/providers/ec2"
	"computeplane/internal/providers/localqemu"
)

func TestSecretLike(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"token", "apiToken", "API_TOKEN", "clientSecret", "password", "rootPassword", "key", "sshKey", "accessKey"} {
		assert.True(t, providers.SecretLike(n), n)
	}
	for _, n := range []string{"region", "keys", "tokens", "keyName", "secretName", "passwordless", "image"} {
		assert.False(t, providers.SecretLike(n), n)
	}
}

func TestCheckReference(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"secret://tenants/acme/db", "secret://fleet/cloud-token", "vault://kv/data/cloud#token", "vault://kv/cloud",
		"env://COMPUTE_PROVIDER_TOKEN"} {
		assert.Empty(t, providers.CheckReference(ok), ok)
	}
	for _, bad := range []string{"", "hunter2", "secret://", "secret://tenants/acme", "secret://other/x", "vault://", "vault:///abs",
		"env://", "env://A-B", "env://A/B", "https://example.com/token", "SECRET://fleet/x", " secret://fleet/x"} {
		assert.NotEmpty(t, providers.CheckReference(bad), bad)
	}
}

func TestReferencesAtAnyDepth(t *testing.T) {
	t.Parallel()
	var cfg any
	require.NoError(t, json.Unmarshal([]byte(`{
		"region": "eu", "apiToken": "secret://fleet/t",
		"nodes": [{"sshKey": "ssh-ed25519 AAAA", "name": "a"}, {"sshKey": "env://COMPUTE_PROVIDER_SSH"}],
		"auth": {"password": 1234, "user": "root", "clientSecret": null},
		"accessKey": {"id": "x"}
	}`), &cfg))
	issues := providers.References(cfg)
	var paths []string
	for _, i := range issues {
		paths = append(paths, i.Path)
	}
	assert.Equal(t, []string{"config.accessKey", "config.auth.password", "config.nodes[0].sshKey"}, paths)
}

func TestManifestSchema(t *testing.T) {
	t.Parallel()
	check := func(s string) []providers.Issue {
		var cfg any
		require.NoError(t, json.Unmarshal([]byte(s), &cfg))
		issues, err := localqemu.Manifest.Check(cfg)
		require.NoError(t, err)
		return issues
	}
	assert.Empty(t, check(`{"image": "computeplane/minimal", "machineTypes": [{"name": "small", "vcpu": 1, "memoryMiB": 256}]}`))
	issues := check(`{"image": "", "machineTypes": [{"name": "bad name", "vcpu": 0, "memoryMiB": 256}], "extra": 1}`)
	paths := map[string]bool{}
	for _, i := range issues {
		paths[i.Path] = true
		assert.NotEmpty(t, i.Message)
	}
	assert.True(t, paths["config.image"], issues)
	assert.True(t, paths["config.machineTypes[0].name"], issues)
	assert.True(t, paths["config.machineTypes[0].vcpu"], issues)
	assert.True(t, paths["config"], issues) // the extra property
	assert.NotEmpty(t, check(`[]`))
	assert.NotEmpty(t, check(`"x"`))
	assert.NotEmpty(t, check(`{}`))
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	builtIn := []*providers.Factory{localqemu.Factory, ec2.Factory}
	r, err := providers.NewRegistry(builtIn, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"ec2", "localqemu"}, r.Known())
	r, err = providers.NewRegistry(builtIn, []string{"localqemu"})
	require.NoError(t, err)
	assert.Equal(t, []string{"localqemu"}, r.Known())
	_, err = providers.NewRegistry(builtIn, []string{"hetzner"})
	assert.ErrorContains(t, err, "not built into this binary (built in: ec2, localqemu)")
	_, err = providers.NewRegistry([]*providers.Factory{ec2.Factory, ec2.Factory}, nil)
	assert.ErrorContains(t, err, "built in twice")
	assert.Len(t, r.Check("hetzner", map[string]any{}), 1)
	m := localqemu.Manifest
	assert.True(t, m.CanBootstrap())
}

func TestQueryMatch(t *testing.T) {
	t.Parallel()
	o := providers.Offer{ID: "g", Kind: "metal", Region: "eu", VCPU: 32, MemoryMiB: 65536, GPUs: 4, GPUModel: "H100"}
	assert.True(t, providers.Query{}.Match(o))
	assert.True(t, providers.Query{Kind: "metal", Region: "eu", GPUModel: "h100", MinGPUs: 4, MinVCPU: 32, MinGiB: 64}.Match(o))
	for _, q := range []providers.Query{{Kind: "vps"}, {Region: "us"}, {GPUModel: "L4"}, {MinGPUs: 5}, {MinVCPU: 33}, {MinGiB: 65}} {
		assert.False(t, q.Match(o), q)
	}
}

// FuzzCheckConfig: any JSON config is checked without panicking, a
// secret-like field passes only as a well-formed reference, and the
// issues name paths under config.
func FuzzCheckConfig(f *testing.F) {
	for _, s := range []string{`{}`, `{"apiToken": "secret://fleet/x"}`, `{"a": [{"sshKey": "k"}]}`, `{"image": "x", "machineTypes": []}`,
		`[1, {"password": null}]`, `{"Key": {"key": "env://A"}}`, `"x"`, `null`, `{"machineTypes": [{"name": "", "vcpu": 1e9}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var cfg any
		if json.Unmarshal(b, &cfg) != nil {
			return
		}
		issues, err := localqemu.Manifest.Check(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range issues {
			if len(i.Path) < 6 || i.Path[:6] != "config" || i.Message == "" {
				t.Fatalf("issue %+v", i)
			}
		}
		for _, i := range providers.References(cfg) {
			if i.Message == "" {
				t.Fatalf("issue %+v", i)
			}
		}
	})
}

func FuzzCheckReference(f *testing.F) {
	for _, s := range []string{"secret://fleet/x", "vault://a#b", "env://X", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if providers.CheckReference(s) == "" {
			ok := false
			for _, p := range providers.Schemes {
				if len(s) > len(p) && s[:len(p)] == p {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("%q accepted", s)
			}
		}
	})
}

func TestRefs(t *testing.T) {
	t.Parallel()
	var cfg any
	require.NoError(t, json.Unmarshal([]byte(`{"apiToken": "secret://tenants/acme/t", "nodes": [{"sshKey": "env://COMPUTE_PROVIDER_K"}],
		"password": "clear", "name": "secret://tenants/acme/not-secret-like"}`), &cfg))
	assert.Equal(t, []providers.Ref{{Path: "config.apiToken", Ref: "secret://tenants/acme/t"}, {Path: "config.nodes[0].sshKey", Ref: "env://COMPUTE_PROVIDER_K"}},
		providers.Refs(cfg))
}
