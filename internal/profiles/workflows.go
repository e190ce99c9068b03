package profiles

import (
	"context"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/workflows"
)

// ForWorkflows plugs the group into the workflow engine's ports:
//
//	workflows.Profiles = profiles.ForWorkflows{}
//	workflows.ProfileLocker = profiles.ForWorkflows{}
//
// Render answers in the specification's lookup order (the tenant's own,
// public, then shipped, which include metal-host), so a tenant's own
// profile of a shipped id is the one its workflows run.
type ForWorkflows struct{}

var (
	_ workflows.Renderer = ForWorkflows{}
	_ workflows.Locker   = ForWorkflows{}
)

// Render renders the profile as tenant sees it into the engine's steps.
func (ForWorkflows) Render(ctx context.Context, tx pgx.Tx, tenant, id string, version int) (*workflows.Rendered, error) {
	r, err := Render(ctx, tx, tenant, id, version)
	if err != nil {
		return nil, err
	}
	out := &workflows.Rendered{Tenant: r.Entry.Tenant, ID: r.Entry.ID, Version: r.Entry.Version, Steps: make([]workflows.Step, 0, len(r.Steps))}
	for _, s := range r.Steps {
		out.Steps = append(out.Steps, workflows.Step{Name: s.Name, Phase: s.Phase, Uses: s.Uses, With: s.With, TimeoutMs: s.TimeoutMs, Retries: s.Retries})
	}
	return out, nil
}

// Lock is Lock: the version's document becomes immutable.
func (ForWorkflows) Lock(ctx context.Context, tx pgx.Tx, tenant, id string, version int) error {
	return Lock(ctx, tx, tenant, id, version)
}
