package profiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
)

// Entry is one profile version as a tenant's lookup finds it: a stored
// one (the tenant's own or a public one) or a shipped one (tenant
// builtin).
type Entry struct {
	Tenant     string
	ID         string
	Version    int
	Document   map[string]any
	Visibility string
	RowVersion int64
	CreatedAt  time.Time
	UpdatedAt  time.Time
	LockedAt   *time.Time
}

// Ref names the entry as tenant/id@version.
func (e *Entry) Ref() string { return fmt.Sprintf("%s/%s@%d", e.Tenant, e.ID, e.Version) }

func entryOf(p db.Profile) (*Entry, error) {
	var doc map[string]any
	if err := json.Unmarshal(p.Document, &doc); err != nil {
		return nil, err
	}
	return &Entry{Tenant: p.TenantID, ID: p.ProfileID, Version: int(p.ProfileVersion), Document: doc, Visibility: p.Visibility,
		RowVersion: p.Version, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt, LockedAt: p.LockedAt}, nil
}

func builtinEntry(b *builtin) *Entry {
	t := BuiltinTime
	return &Entry{Tenant: BuiltinTenant, ID: b.d.ID, Version: b.d.Version, Document: b.doc, Visibility: "public", RowVersion: 1,
		CreatedAt: BuiltinTime, UpdatedAt: BuiltinTime, LockedAt: &t}
}

func notFound(id string, version int) error {
	if version == 0 {
		return api.Errorf(api.CodeNotFound, "profileId: profile %s not found", id)
	}
	return api.Errorf(api.CodeNotFound, "profileVersion: profile %s version %d not found", id, version)
}

// Lookup finds the profile version tenant sees (version 0: the latest),
// preferring the tenant's own, then a public stored one, then a shipped
// one; NOT_FOUND when none.
func Lookup(ctx context.Context, tx db.DBTX, tenant, id string, version int) (*Entry, error) {
	q := db.New(tx)
	var p db.Profile
	var err error
	if version == 0 {
		p, err = q.LookupLatestProfile(ctx, db.LookupLatestProfileParams{ProfileID: id, TenantID: tenant})
	} else {
		p, err = q.LookupProfile(ctx, db.LookupProfileParams{ProfileID: id, ProfileVersion: int32(version), TenantID: tenant})
	}
	switch {
	case err == nil:
		return entryOf(p)
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, err
	}
	if b := findBuiltin(id, version); b != nil {
		return builtinEntry(b), nil
	}
	return nil, notFound(id, version)
}

// Step is one expanded step of a rendered profile: what a workflow runs.
type Step struct {
	Name      string         `json:"name"` // outer/inner for steps of included profiles
	Phase     string         `json:"phase"`
	Uses      string         `json:"uses"` // a built-in action (Actions)
	With      map[string]any `json:"with"` // "${name}" values are workflow inputs
	TimeoutMs int64          `json:"timeoutMs"`
	Retries   int            `json:"retries"`
	Profile   string         `json:"profile"` // the declaring profile, tenant/id@version
}

// Rendering is a profile version expanded into its steps.
type Rendering struct {
	Entry *Entry
	Steps []Step
}

// Resolve expands entry's steps as tenant sees the profiles it uses and
// returns every issue found (an unresolved use, a rejected with, a cycle,
// a driver capability the document does not require), by the path of the
// field of entry's document it is about. Problems of an included profile
// are issues of the step that includes it.
func Resolve(ctx context.Context, tx db.DBTX, tenant string, entry *Entry) ([]Step, []Issue, error) {
	r := &resolver{ctx: ctx, tx: tx, tenant: tenant}
	steps, issues, err := r.expand(entry, []string{entry.ID + "@" + fmt.Sprint(entry.Version)}, "")
	if err != nil {
		return nil, nil, err
	}
	sortIssues(issues)
	return steps, issues, nil
}

type resolver struct {
	ctx    context.Context
	tx     db.DBTX
	tenant string
	total  int
}

func (r *resolver) expand(e *Entry, chain []string, prefix string) ([]Step, []Issue, error) {
	d, issues := Check(e.Document)
	if len(issues) > 0 {
		return nil, issues, nil
	}
	var steps []Step
	for i, s := range d.Steps {
		at := fmt.Sprintf("steps[%d]", i)
		if id, version, ok := UsesProfile(s.Uses); ok {
			ref := fmt.Sprintf("%s@%d", id, version)
			if slices.Contains(chain, ref) {
				issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("profile %s is a cycle: %s -> %s", ref, strings.Join(chain, " -> "), ref)})
				continue
			}
			if len(chain) >= MaxDepth {
				issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("profile %s nests deeper than %d profiles", ref, MaxDepth)})
				continue
			}
			inner, err := Lookup(r.ctx, r.tx, r.tenant, id, version)
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
				issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("profile %s does not resolve", ref)})
				continue
			}
			if err != nil {
				return nil, nil, err
			}
			sub, subIssues, err := r.expand(inner, append(slices.Clone(chain), ref), prefix+s.Name+"/")
			if err != nil {
				return nil, nil, err
			}
			for _, is := range subIssues {
				msg := fmt.Sprintf("profile %s: %s", ref, is.Message)
				if is.Path != "" {
					msg = fmt.Sprintf("profile %s: %s: %s", ref, is.Path, is.Message)
				}
				issues = append(issues, Issue{Path: at + ".uses", Message: msg})
			}
			steps = append(steps, sub...)
			continue
		}
		if strings.HasPrefix(s.Uses, ProfileUsePrefix) {
			issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("%s names no profile version (profile:<id>@<version>, version 1 to 1000000)", s.Uses)})
			continue
		}
		withIssues, ok := checkWith(s.Uses, s.With)
		if !ok {
			issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("%s is neither a built-in action nor a profile (profile:<id>@<version>)", s.Uses)})
			continue
		}
		for _, w := range withIssues {
			issues = append(issues, Issue{Path: at + ".with." + w.Path, Message: w.Message})
		}
		if need := ActionNeeds[s.Uses]; need != "" && len(d.Requires) > 0 && !slices.Contains(d.Requires, need) {
			issues = append(issues, Issue{Path: at + ".uses", Message: fmt.Sprintf("%s needs the driver capability %s, which requires does not name", s.Uses, need)})
		}
		timeout := DefaultTimeoutSeconds
		if s.TimeoutSeconds != nil {
			timeout = *s.TimeoutSeconds
		}
		retries := DefaultRetries
		if s.Retries != nil {
			retries = *s.Retries
		}
		with := s.With
		if with == nil {
			with = map[string]any{}
		}
		r.total++
		if r.total > MaxExpandedSteps {
			issues = append(issues, Issue{Path: at, Message: fmt.Sprintf("the rendering expands to more than %d steps", MaxExpandedSteps)})
			return steps, issues, nil
		}
		steps = append(steps, Step{Name: prefix + s.Name, Phase: s.Phase, Uses: s.Uses, With: with,
			TimeoutMs: int64(timeout) * 1000, Retries: retries, Profile: e.Ref()})
	}
	return steps, issues, nil
}

// Render looks the profile version up as tenant sees it (version 0: the
// latest) and expands it into its steps, in the order a workflow runs
// them, each with its phase. NOT_FOUND for an unknown profile;
// INVALID_INPUT with details.issues when it does not resolve.
func Render(ctx context.Context, tx db.DBTX, tenant, id string, version int) (*Rendering, error) {
	e, err := Lookup(ctx, tx, tenant, id, version)
	if err != nil {
		return nil, err
	}
	steps, issues, err := Resolve(ctx, tx, tenant, e)
	if err != nil {
		return nil, err
	}
	if len(issues) > 0 {
		msg := issues[0].Message
		if issues[0].Path != "" {
			msg = issues[0].Path + ": " + msg
		}
		return nil, api.Errorf(api.CodeInvalidInput, "profileId: profile %s does not resolve: %s", e.Ref(), msg).
			WithDetails(map[string]any{"issues": issues})
	}
	return &Rendering{Entry: e, Steps: steps}, nil
}

// Lock makes a stored profile version's document immutable: a workflow
// engine calls it in the transaction that starts a workflow on the
// version. A second lock keeps the first time. Shipped profiles (tenant
// builtin) are immutable already; a version the tenant does not store is
// NOT_FOUND.
func Lock(ctx context.Context, tx pgx.Tx, tenant, id string, version int) error {
	// A tenant may be named builtin too: its stored rows are locked like
	// any other's.
	n, err := db.New(tx).LockProfile(ctx, db.LockProfileParams{TenantID: tenant, ProfileID: id, ProfileVersion: int32(version)})
	if err != nil {
		return err
	}
	if n == 0 && (tenant != BuiltinTenant || version == 0 || findBuiltin(id, version) == nil) {
		return notFound(id, version)
	}
	return nil
}
