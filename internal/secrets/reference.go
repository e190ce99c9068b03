package secrets

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"computeplane/gen/api"
	"computeplane/gen/db"
)

// Scopes of a secret.
const (
	ScopeTenant = "tenant"
	ScopeFleet  = "fleet"
)

// Prefixes of the two reference forms.
const (
	tenantPrefix = "secret://tenants/"
	fleetPrefix  = "secret://fleet/"
)

// Reference names a secret: secret://tenants/<tenantId>/<name> for scope
// tenant, secret://fleet/<name> for scope fleet (owned by the root tenant,
// so TenantID is empty in the parsed form). Every secret has exactly one
// reference string: String of a parsed reference gives back its input.
type Reference struct {
	Scope    string // ScopeTenant or ScopeFleet
	TenantID string // the owner tenant of a tenant secret; empty for fleet
	Name     string // a SecretName
}

// String is the reference's canonical form.
func (r Reference) String() string {
	if r.Scope == ScopeFleet {
		return fleetPrefix + r.Name
	}
	return tenantPrefix + r.TenantID + "/" + r.Name
}

// ParseReference reads a secret:// reference. Tenant ids and names never
// hold a slash, so the form is read exactly, without URL normalization:
// anything but the two forms with a TenantId and a SecretName is an error.
func ParseReference(s string) (Reference, error) {
	var r Reference
	switch {
	case strings.HasPrefix(s, fleetPrefix):
		r = Reference{Scope: ScopeFleet, Name: s[len(fleetPrefix):]}
	case strings.HasPrefix(s, tenantPrefix):
		tenant, name, ok := strings.Cut(s[len(tenantPrefix):], "/")
		if !ok {
			return Reference{}, fmt.Errorf("secret reference: want secret://tenants/<tenantId>/<name>")
		}
		if !api.ShapeTenantId.MatchString(tenant) {
			return Reference{}, fmt.Errorf("secret reference: the tenant id is not a TenantId")
		}
		r = Reference{Scope: ScopeTenant, TenantID: tenant, Name: name}
	default:
		return Reference{}, fmt.Errorf("secret reference: want secret://tenants/<tenantId>/<name> or secret://fleet/<name>")
	}
	if !api.ShapeSecretName.MatchString(r.Name) {
		return Reference{}, fmt.Errorf("secret reference: the name is not a SecretName")
	}
	return r, nil
}

// owner is the tenant that owns the secret: its tenant, or root for fleet.
func (r Reference) owner(root string) string {
	if r.Scope == ScopeFleet {
		return root
	}
	return r.TenantID
}

var uriRe = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]*`)

// URIs returns the URIs in text (user data, say) in order: the secret://
// references among them are what a host resolves at boot.
func URIs(text string) []string { return uriRe.FindAllString(text, -1) }

// IsReference says whether a URI is meant as a secret reference (it may
// still be malformed).
func IsReference(uri string) bool { return strings.HasPrefix(uri, "secret://") }

// CheckUserData checks the secret references in user data: each names a
// live secret of tenant (hosts resolve them at boot; user data is stored
// and carried with the references only). With strict, every URI in it
// must be such a reference (sandbox templates, rule 5).
func CheckUserData(ctx context.Context, q *db.Queries, tenant string, userData *string, strict bool) error {
	if userData == nil {
		return nil
	}
	for _, u := range URIs(*userData) {
		if !strict && !IsReference(u) {
			continue
		}
		ref, err := ParseReference(u)
		if err != nil || ref.Scope != ScopeTenant || ref.TenantID != tenant {
			return api.Errorf(api.CodeInvalidInput, "userData: %q is not a secret:// reference to a secret of tenant %s", u, tenant)
		}
		ok, err := q.LiveTenantSecret(ctx, db.LiveTenantSecretParams{Reference: ref.String(), TenantID: tenant})
		if err != nil {
			return err
		}
		if !ok {
			return api.Errorf(api.CodeInvalidInput, "userData: secret %s does not exist", ref.String())
		}
	}
	return nil
}
