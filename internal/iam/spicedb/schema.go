// Package spicedb decides require and authorize with a SpiceDB server
// (github.com/authzed/spicedb) while the embedded identity service keeps
// tenants, identities, keys, role bindings, delegations and the projection
// record in PostgreSQL. The adapter mirrors into SpiceDB what decisions
// are made on: the projection's resources (tenant, parent, owner, the
// shared attribute, drafts), project membership, and role bindings; then
// every decision is one CheckBulkPermissions call. The schema and the
// mapping are written down in docs/identity.md ("External decisions").
package spicedb

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"

	"computeplane/gen/api"
)

// Relations and permissions of the schema.
const (
	relTenant    = "tenant"
	relParent    = "parent"
	relOwner     = "owner"
	relMember    = "member"
	relSharedBy  = "shared_by"
	relProjected = "projected"
	relBound     = "bound"

	permRead          = "read"
	permChange        = "change"
	permAdminister    = "administer"
	permAdminUp       = "admin_up"
	permProjectMember = "project_member"
)

// platformID is the one object of the platform definition.
const platformID = "all"

// BaseTypes are the resource types (without the prefix) every schema
// holds, besides those the catalog's methods decide on: parents the
// services write (pool, node, sandbox) and projects.
var BaseTypes = []string{"tenant", "project", "pool", "node", "sandbox", "site", "fleet"}

// CatalogTypes lists the resource types (without the prefix) the
// registered methods decide on or create, with BaseTypes, sorted.
func CatalogTypes() []string {
	types := slices.Clone(BaseTypes)
	for _, m := range api.Methods {
		if r := m.Resource; r != nil {
			types = append(types, r.Type)
			if r.Creates != "" {
				types = append(types, r.Creates)
			}
			if r.Parent != nil {
				types = append(types, r.Parent.Type)
			}
			for _, a := range r.Alternates {
				types = append(types, a.Type)
			}
		}
	}
	slices.Sort(types)
	return slices.Compact(types)
}

var definitionName = regexp.MustCompile(`^[a-z][a-z0-9_]{1,62}[a-z0-9]$`)

// names maps the service's resource types (typePrefix + name) to SpiceDB
// definitions: the prefix becomes SpiceDB's namespace (compute- ->
// compute/), and - becomes _ (SpiceDB names take no hyphen).
type names struct {
	prefix string // the service's typePrefix, e.g. compute-
	ns     string // the SpiceDB namespace with its slash, e.g. compute/
}

func newNames(prefix string) names {
	ns := strings.ReplaceAll(strings.TrimRight(prefix, "-"), "-", "_")
	if definitionName.MatchString(ns) {
		return names{prefix: prefix, ns: ns + "/"}
	}
	// A prefix too short for a namespace is kept in each name instead.
	return names{prefix: prefix, ns: strings.ReplaceAll(prefix, "-", "_")}
}

// def is the definition of a resource type given with or without the
// service's prefix.
func (n names) def(typ string) string {
	return n.ns + strings.ReplaceAll(strings.TrimPrefix(typ, n.prefix), "-", "_")
}

func (n names) principal() string { return n.ns + "principal" }
func (n names) platform() string  { return n.ns + "platform" }

// Schema is the SpiceDB schema of the projection for types (without the
// prefix). Every resource type has the same shape: the tenant it belongs
// to, a parent (any type), an owner (its creator), project members, the
// platform when it is shared, and projected (a wildcard written for every
// object the projection holds, so a decision knows whether SpiceDB holds
// it).
func Schema(prefix string, types []string) (string, error) {
	n := newNames(prefix)
	var defs []string
	for _, t := range types {
		d := n.def(t)
		name := d[strings.LastIndexByte(d, '/')+1:]
		if !definitionName.MatchString(name) {
			return "", fmt.Errorf("spicedb: resource type %q makes no SpiceDB definition name (%q)", t, name)
		}
		defs = append(defs, d)
	}
	var b strings.Builder
	p, pl := n.principal(), n.platform()
	fmt.Fprintf(&b, "/** an identity of the embedded service (its id, escaped) */\ndefinition %s {}\n\n", p)
	fmt.Fprintf(&b, "/** every identity bound to a role: readers of shared platform objects */\ndefinition %s {\n\trelation %s: %s\n}\n\n", pl, relBound, p)
	fmt.Fprintf(&b, `/** a tenant and its role bindings; creates are decided on it */
definition %s {
	relation owner: %s
	relation admin: %s
	relation member: %s
	relation viewer: %s
	permission admin_up = owner + admin
	permission member_up = admin_up + member
	permission viewer_up = member_up + viewer
	permission project_member = nil
	permission read = viewer_up
	permission change = member_up
	permission administer = admin_up
}

`, n.def("tenant"), p, p, p, p)
	parents := strings.Join(defs, " | ")
	for i, t := range types {
		if t == "tenant" {
			continue
		}
		projectMember := "parent->project_member"
		if t == "project" {
			projectMember = "member + parent->project_member" // a project member is one of this project or of an enclosing one
		}
		fmt.Fprintf(&b, `definition %s {
	relation tenant: %s
	relation parent: %s
	relation owner: %s
	relation member: %s
	relation shared_by: %s
	relation projected: %s:*
	permission project_member = %s
	permission read = tenant->viewer_up + project_member + shared_by->bound
	permission change = tenant->admin_up + (owner & tenant->member_up) + parent->project_member
	permission administer = tenant->admin_up
}

`, defs[i], n.def("tenant"), parents, p, p, pl, p, projectMember)
	}
	return b.String(), nil
}

// escapeID makes an identifier a SpiceDB object id: A-Z a-z 0-9 _ - are
// kept, every other byte is =XX (hex), reversibly.
func escapeID(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	return b.String()
}

// RoleBinding is the relationship SpiceDB holds for identity's role in
// tenant, as the adapter of typePrefix writes it (tests look for it).
func RoleBinding(typePrefix, tenant, identity, role string) *v1.Relationship {
	n := newNames(typePrefix)
	return &v1.Relationship{
		Resource: &v1.ObjectReference{ObjectType: n.def("tenant"), ObjectId: escapeID(tenant)},
		Relation: role,
		Subject:  &v1.SubjectReference{Object: &v1.ObjectReference{ObjectType: n.principal(), ObjectId: escapeID(identity)}},
	}
}
