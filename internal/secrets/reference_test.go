package secrets

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

func TestParseReference(t *testing.T) {
	t.Parallel()
	good := map[string]Reference{
		"secret://tenants/acme/db-password":          {Scope: ScopeTenant, TenantID: "acme", Name: "db-password"},
		"secret://tenants/a.b:c_d-e/N.a_m-e1":        {Scope: ScopeTenant, TenantID: "a.b:c_d-e", Name: "N.a_m-e1"},
		"secret://tenants/fleet/x":                   {Scope: ScopeTenant, TenantID: "fleet", Name: "x"},
		"secret://fleet/registry-token":              {Scope: ScopeFleet, Name: "registry-token"},
		"secret://fleet/" + strings.Repeat("n", 128): {Scope: ScopeFleet, Name: strings.Repeat("n", 128)},
	}
	for s, want := range good {
		got, err := ParseReference(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
		assert.Equal(t, s, got.String(), "canonical")
	}
	for _, s := range []string{
		"", "secret://", "secret://tenants/", "secret://tenants/acme", "secret://tenants/acme/",
		"secret://tenants//name", "secret://tenants/acme/a/b", "secret://fleet/", "secret://fleet/a/b",
		"secret://fleet/.hidden", "secret://fleet/" + strings.Repeat("n", 129),
		"secret://tenants/" + strings.Repeat("t", 129) + "/n", "secret://tenants/ac me/n",
		"SECRET://fleet/x", "secret:/fleet/x", "vault://fleet/x", "secret://other/x",
		"secret://fleet/x?version=1", "secret://fleet/x#f", "secret://tenants/acme/x\n",
		" secret://fleet/x", "secret://fleet/%41",
	} {
		_, err := ParseReference(s)
		assert.Error(t, err, "%q", s)
	}
}

// FuzzParseReference: whatever parses is in canonical form (one string per
// secret), its parts have their shapes, and building a reference from
// valid parts parses back to them.
func FuzzParseReference(f *testing.F) {
	for _, s := range []string{
		"secret://tenants/acme/db", "secret://fleet/x", "secret://tenants/a/b/c", "secret://fleet/",
		"secret://tenants//x", "secret://tenants/fleet/x", "",
	} {
		f.Add(s, "acme", "db-password")
	}
	f.Fuzz(func(t *testing.T, s, tenant, name string) {
		r, err := ParseReference(s)
		if err == nil {
			if r.String() != s {
				t.Fatalf("%q parsed to %+v, which prints as %q", s, r, r.String())
			}
			if !api.ShapeSecretName.MatchString(r.Name) {
				t.Fatalf("%q: name %q is not a SecretName", s, r.Name)
			}
			switch r.Scope {
			case ScopeFleet:
				if r.TenantID != "" {
					t.Fatalf("%q: a fleet reference has no tenant", s)
				}
			case ScopeTenant:
				if !api.ShapeTenantId.MatchString(r.TenantID) {
					t.Fatalf("%q: tenant %q is not a TenantId", s, r.TenantID)
				}
			default:
				t.Fatalf("%q: scope %q", s, r.Scope)
			}
		}
		if !api.ShapeTenantId.MatchString(tenant) || !api.ShapeSecretName.MatchString(name) {
			return
		}
		for _, want := range []Reference{{Scope: ScopeTenant, TenantID: tenant, Name: name}, {Scope: ScopeFleet, Name: name}} {
			got, err := ParseReference(want.String())
			if err != nil || got != want {
				t.Fatalf("%+v: printed %q, parsed %+v, %v", want, want.String(), got, err)
			}
		}
	})
}
