// Package sandboxtemplates implements the sandboxTemplates group: what a
// tenant's sandboxes run (pool, flavor, image, TTLs, warm pool bounds, env,
// network, user data with secret references, volume mounts), checked by
// the specification's create rules 1 to 9 and its update rules. The
// caller who creates a template owns it in the authorization projection.
package sandboxtemplates

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/flavors"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/images"
	"computeplane/internal/pools"
	"computeplane/internal/secrets"
	"computeplane/internal/store"
	"computeplane/internal/vmnet"
	"computeplane/internal/wire"
)

// ResourceType is the template's type in the authorization projection.
const ResourceType = "sandbox-template"

// Defaults of the specification.
const (
	DefaultTTL    = 3600
	DefaultMaxTTL = 86400
	DefaultNet    = "egress"
)

// Service implements api.SandboxTemplatesService.
type Service struct {
	Images images.Source
}

var _ api.SandboxTemplatesService = (*Service)(nil)

// mount is a template's volume entry as stored: as given, and the volume
// it resolved to.
type mount struct {
	api.VolumeMount
	Resolved string `json:"resolved"`
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "template %s not found", id) }

// warmReady counts each template's warm instances ready to be claimed.
func warmReady(ctx context.Context, q *db.Queries, ids ...string) (map[string]int64, error) {
	rows, err := q.WarmReadyCounts(ctx, ids)
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.TemplateID] = r.Ready
	}
	return out, err
}

// output is the template with ready, its warm instances ready to be
// claimed.
func output(t db.SandboxTemplate, ready int64) (*api.SandboxTemplate, error) {
	var env map[string]string
	var ms []mount
	if err := json.Unmarshal(t.Env, &env); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(t.Volumes, &ms); err != nil {
		return nil, err
	}
	vols := make([]api.VolumeMount, 0, len(ms))
	for _, m := range ms {
		vols = append(vols, m.VolumeMount)
	}
	max := int64(t.WarmMax)
	o := &api.SandboxTemplate{TenantID: t.TenantID, TemplateID: t.TemplateID, Name: t.Name, PoolID: t.PoolID, Flavor: t.Flavor,
		ImageID: t.ImageID, Runtime: t.Runtime, DefaultTTLSeconds: int64(t.DefaultTtlSeconds), MaxTTLSeconds: int64(t.MaxTtlSeconds),
		Warm: api.Warm{Min: int64(t.WarmMin), Max: &max}, WarmReady: ready, Env: env, Network: t.Network, Egress: vmnet.Decode(t.EgressPolicy), Volumes: vols, Version: t.Version,
		CreatedAt: wire.Time(t.CreatedAt), UpdatedAt: wire.Time(t.UpdatedAt)}
	if env == nil {
		o.Env = map[string]string{}
	}
	if t.UserData.Valid {
		o.UserData = &t.UserData.String
	}
	return o, nil
}

// shape is what create and update check together.
type shape struct {
	tenant, pool, runtime string
	flavor, image         string
	userData              *string
	defaultTTL, maxTTL    int64
	warmMin, warmMax      int64
	volumes               []api.VolumeMount
}

// checkRuntime applies rules 2 and 3: the flavor and the image, and what
// the pool's runtime boots and passes through.
func (s *Service) checkRuntime(ctx context.Context, q *db.Queries, sh shape) error {
	f, err := flavors.Get(ctx, q, sh.tenant, sh.pool, sh.flavor)
	if err != nil {
		return err
	}
	if f.Archived {
		return api.Errorf(api.CodeNotFound, "flavor: %s is archived", sh.flavor)
	}
	im, err := s.Images.Get(ctx, sh.image)
	if errors.Is(err, images.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "imageId: image %s not found", sh.image)
	}
	if err != nil {
		return err
	}
	if !images.Boots(sh.runtime, im.Format) {
		return api.Errorf(api.CodeInvalidInput, "imageId: the pool's runtime %s does not boot %s images", sh.runtime, im.Format)
	}
	if f.Gpus != nil && f.Gpus.Count > 0 && !images.PassesGPUs(sh.runtime) {
		return api.Errorf(api.CodeInvalidInput, "flavor: the pool's runtime %s does not pass GPUs through", sh.runtime)
	}
	return nil
}

// System directories a volume is never mounted over.
var systemDirs = []string{"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys", "/usr", "/var"}

// checkVolumes applies rules 6 and 7: each volume the tenant's, ready, in
// the pool, named once, decided on the caller's own credential; mount
// paths clean, not over a system directory, not nested; volumes need
// warm.max 0. It returns the mounts with the volumes they resolved to.
func checkVolumes(ctx context.Context, sess *iam.Session, q *db.Queries, sh shape) ([]mount, error) {
	if len(sh.volumes) > 0 && sh.warmMax != 0 {
		return nil, api.Errorf(api.CodeInvalidInput, "warm: a template with volumes needs warm.max 0")
	}
	out := make([]mount, 0, len(sh.volumes))
	seen := map[string]bool{}
	for i, m := range sh.volumes {
		at := fmt.Sprintf("volumes[%d]", i)
		var v db.SandboxVolume
		var err error
		switch {
		case m.VolumeID != nil:
			v, err = q.GetSandboxVolume(ctx, *m.VolumeID)
		case m.Name != nil:
			v, err = q.SandboxVolumeByName(ctx, db.SandboxVolumeByNameParams{TenantID: sh.tenant, Name: *m.Name})
		}
		if v, err = store.Visible(v, err, v.TenantID == sh.tenant, api.Errorf(api.CodeNotFound, "%s: volume not found", at)); err != nil {
			return nil, err
		}
		switch {
		case v.State != "ready":
			return nil, api.Errorf(api.CodeInvalidState, "%s: volume %s is %s", at, v.VolumeID, v.State)
		case v.PoolID != sh.pool:
			return nil, api.Errorf(api.CodeInvalidInput, "%s: volume %s is in another pool", at, v.VolumeID)
		case seen[v.VolumeID]:
			return nil, api.Errorf(api.CodeInvalidInput, "%s: volume %s is named twice", at, v.VolumeID)
		}
		seen[v.VolumeID] = true
		p := m.MountPath
		if path.Clean(p) != p || strings.Contains(p, "/./") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			return nil, api.Errorf(api.CodeInvalidInput, "%s.mountPath: %s has . or .. segments", at, p)
		}
		for _, d := range systemDirs {
			if p == d || (d != "/" && strings.HasPrefix(p, d+"/")) {
				return nil, api.Errorf(api.CodeInvalidInput, "%s.mountPath: %s is over a system directory (%s)", at, p, d)
			}
		}
		for j, o := range out {
			if p == o.MountPath || strings.HasPrefix(p, o.MountPath+"/") || strings.HasPrefix(o.MountPath, p+"/") {
				return nil, api.Errorf(api.CodeInvalidInput, "%s.mountPath: %s overlaps volumes[%d] (%s)", at, p, j, o.MountPath)
			}
		}
		action := "compute:sandboxes:manage"
		if m.ReadOnly {
			action = "compute:sandboxes:read"
		}
		if !sess.CanRead(ctx, action, "sandbox-volume", v.VolumeID, sh.tenant) {
			return nil, api.Errorf(api.CodeAccessDenied, "%s: %s on volume %s is not allowed", at, action, v.VolumeID)
		}
		out = append(out, mount{VolumeMount: m, Resolved: v.VolumeID})
	}
	return out, nil
}

func checkTTL(sh shape) error {
	switch {
	case sh.defaultTTL > sh.maxTTL:
		return api.Errorf(api.CodeInvalidInput, "defaultTtlSeconds: %d is above maxTtlSeconds %d", sh.defaultTTL, sh.maxTTL)
	case sh.warmMax < sh.warmMin:
		return api.Errorf(api.CodeInvalidInput, "warm.max: %d is below warm.min %d", sh.warmMax, sh.warmMin)
	}
	return nil
}

// Create answers sandboxTemplates.create.
func (s *Service) Create(ctx context.Context, in *api.SandboxTemplatesCreateInput) (*api.SandboxTemplate, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := pools.Readable(ctx, q, in.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	switch {
	case pool.Archived:
		return nil, api.Errorf(api.CodeNotFound, "pool %s not found", in.PoolID)
	case pool.Hosting != "hosted" || pool.Class != "vps-host":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: templates need a hosted vps-host pool")
	}
	runtime := pool.Runtime.String
	if runtime == "" {
		runtime = "qemu"
	}
	if in.Runtime != nil && *in.Runtime != runtime {
		return nil, api.Errorf(api.CodeInvalidInput, "runtime: %s is not the pool's runtime %s", *in.Runtime, runtime)
	}
	sh := shape{tenant: in.TenantID, pool: in.PoolID, runtime: runtime, flavor: in.Flavor, image: in.ImageID,
		defaultTTL: in.DefaultTTLSeconds, volumes: in.Volumes}
	if sh.defaultTTL == 0 {
		sh.defaultTTL = DefaultTTL
	}
	sh.maxTTL = max(DefaultMaxTTL, sh.defaultTTL)
	if in.MaxTTLSeconds != nil {
		sh.maxTTL = *in.MaxTTLSeconds
	}
	if in.Warm != nil {
		sh.warmMin, sh.warmMax = in.Warm.Min, in.Warm.Min
		if in.Warm.Max != nil {
			sh.warmMax = *in.Warm.Max
		}
	}
	if in.UserData.Set() {
		sh.userData = &in.UserData.Value
	}
	if err := s.checkRuntime(ctx, q, sh); err != nil {
		return nil, err
	}
	if err := checkTTL(sh); err != nil {
		return nil, err
	}
	if err := secrets.CheckUserData(ctx, q, in.TenantID, sh.userData, true); err != nil {
		return nil, err
	}
	mounts, err := checkVolumes(ctx, sess, q, sh)
	if err != nil {
		return nil, err
	}
	network := DefaultNet
	if in.Network != nil {
		network = *in.Network
	}
	policy, err := egressOf(network, in.Egress, nil)
	if err != nil {
		return nil, err
	}
	env, _ := json.Marshal(nonNil(in.Env))
	vols, _ := json.Marshal(mounts)
	id := ids.New("sbxt")
	row, err := q.InsertSandboxTemplate(ctx, db.InsertSandboxTemplateParams{TemplateID: id, TenantID: in.TenantID, Name: in.Name,
		PoolID: in.PoolID, Flavor: in.Flavor, ImageID: in.ImageID, Runtime: runtime, UserData: text(sh.userData),
		DefaultTtlSeconds: int32(sh.defaultTTL), MaxTtlSeconds: int32(sh.maxTTL), WarmMin: int32(sh.warmMin), WarmMax: int32(sh.warmMax),
		Env: env, Network: network, Volumes: vols, Owner: sess.Caller.IdentityID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a live template named %s", in.TenantID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	if row.EgressPolicy = policy; policy != nil {
		if err := q.SetSandboxTemplateEgress(ctx, db.SetSandboxTemplateEgressParams{TemplateID: id, EgressPolicy: policy}); err != nil {
			return nil, err
		}
	}
	if err := sess.Projection().Put(ctx, tx, iam.Resource{Type: sess.TypePrefix() + ResourceType, ID: id, TenantID: in.TenantID,
		Parent: &iam.Ref{Type: sess.TypePrefix() + "pool", ID: in.PoolID}, Owner: sess.Caller.IdentityID,
		Attributes: map[string]string{"poolId": in.PoolID}}); err != nil {
		return nil, err
	}
	return output(row, 0) // no warm instance yet
}

// egressOf is a template's egress policy as stored after a create or an
// update: the one given, checked, or the current one, and none of it
// under a network other than egress.
func egressOf(network string, given *api.EgressPolicy, current []byte) ([]byte, error) {
	p := vmnet.Decode(current)
	if given != nil {
		var err error
		if p, err = vmnet.CheckPolicy("egress", *given); err != nil {
			return nil, err
		}
	}
	if err := vmnet.CheckMode("egress", network, p); err != nil {
		return nil, err
	}
	return vmnet.Encode(p), nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func text(s *string) pgtype.Text {
	if s == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *s, Valid: true}
}

func load(ctx context.Context, q *db.Queries, tenant, id string, forUpdate bool) (db.SandboxTemplate, error) {
	get := q.GetSandboxTemplate
	if forUpdate {
		get = q.GetSandboxTemplateForUpdate
	}
	t, err := get(ctx, id)
	return store.Visible(t, err, t.TenantID == tenant, notFound(id))
}

// Get answers sandboxTemplates.get.
func (s *Service) Get(ctx context.Context, in *api.SandboxTemplatesGetInput) (*api.SandboxTemplate, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	t, err := load(ctx, q, in.TenantID, in.TemplateID, false)
	if err != nil {
		return nil, err
	}
	ready, err := warmReady(ctx, q, t.TemplateID)
	if err != nil {
		return nil, err
	}
	return output(t, ready[t.TemplateID])
}

// List answers sandboxTemplates.list: items the caller may not read are
// left out.
func (s *Service) List(ctx context.Context, in *api.SandboxTemplatesListInput) (*api.SandboxTemplateList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListSandboxTemplates(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	for i, t := range rows {
		ids[i] = t.TemplateID
	}
	ready, err := warmReady(ctx, q, ids...)
	if err != nil {
		return nil, err
	}
	out := &api.SandboxTemplateList{Items: []api.SandboxTemplate{}}
	for _, t := range rows {
		if !sess.CanRead(ctx, "compute:sandboxes:read", ResourceType, t.TemplateID, t.TenantID) {
			continue
		}
		o, err := output(t, ready[t.TemplateID])
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, *o)
	}
	return out, nil
}

// Update answers sandboxTemplates.update. The template's row is held for
// the whole decision, so secret and volume changes of concurrent updates
// are decided one after the other.
func (s *Service) Update(ctx context.Context, in *api.SandboxTemplatesUpdateInput) (*api.SandboxTemplate, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	t, err := load(ctx, q, in.TenantID, in.TemplateID, true)
	if err != nil {
		return nil, err
	}
	var cur []mount
	if err := json.Unmarshal(t.Volumes, &cur); err != nil {
		return nil, err
	}
	sh := shape{tenant: t.TenantID, pool: t.PoolID, runtime: t.Runtime, flavor: t.Flavor, image: t.ImageID,
		defaultTTL: int64(t.DefaultTtlSeconds), maxTTL: int64(t.MaxTtlSeconds), warmMin: int64(t.WarmMin), warmMax: int64(t.WarmMax)}
	if t.UserData.Valid {
		sh.userData = &t.UserData.String
	}
	for _, m := range cur {
		sh.volumes = append(sh.volumes, m.VolumeMount)
	}
	shapeChanged := false
	if in.Flavor != nil {
		sh.flavor, shapeChanged = *in.Flavor, true
	}
	if in.ImageID != nil {
		sh.image, shapeChanged = *in.ImageID, true
	}
	if in.UserData.Present {
		sh.userData, shapeChanged = nil, true
		if in.UserData.Set() {
			sh.userData = &in.UserData.Value
		}
	}
	if in.DefaultTTLSeconds != nil {
		sh.defaultTTL = *in.DefaultTTLSeconds
	}
	if in.MaxTTLSeconds != nil {
		sh.maxTTL = *in.MaxTTLSeconds
	}
	if in.Warm != nil {
		sh.warmMin, sh.warmMax = in.Warm.Min, in.Warm.Min
		if in.Warm.Max != nil {
			sh.warmMax = *in.Warm.Max
		}
	}
	env := json.RawMessage(t.Env)
	if in.Env != nil {
		env, _ = json.Marshal(in.Env)
		shapeChanged = true
	}
	network := t.Network
	if in.Network != nil {
		network, shapeChanged = *in.Network, true
	}
	policy, err := egressOf(network, in.Egress, t.EgressPolicy)
	if err != nil {
		return nil, err
	}
	if in.Volumes != nil {
		sh.volumes = in.Volumes
	}
	if in.Flavor != nil || in.ImageID != nil {
		if err := s.checkRuntime(ctx, q, sh); err != nil {
			return nil, err
		}
	}
	if err := checkTTL(sh); err != nil {
		return nil, err
	}
	if err := secrets.CheckUserData(ctx, q, t.TenantID, sh.userData, true); err != nil {
		return nil, err
	}
	mounts := cur
	if in.Volumes != nil || shapeChanged || in.Warm != nil {
		if mounts, err = checkVolumes(ctx, sess, q, sh); err != nil {
			return nil, err
		}
		// A name that now means another volume than the one decided
		// before: decide again with the new one in view.
		if in.Volumes == nil {
			for i := range mounts {
				if mounts[i].Resolved != cur[i].Resolved {
					return nil, api.Errorf(api.CodeConflict, "volumes[%d]: the name %s now names another volume; retry", i, *mounts[i].Name).
						WithDetails(map[string]any{"reason": "volumes-changed"})
				}
			}
		}
	}
	vols, _ := json.Marshal(mounts)
	row, err := q.UpdateSandboxTemplate(ctx, db.UpdateSandboxTemplateParams{TemplateID: t.TemplateID, Flavor: sh.flavor, ImageID: sh.image,
		UserData: text(sh.userData), DefaultTtlSeconds: int32(sh.defaultTTL), MaxTtlSeconds: int32(sh.maxTTL),
		WarmMin: int32(sh.warmMin), WarmMax: int32(sh.warmMax), Env: env, Network: network, Volumes: vols})
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(policy, row.EgressPolicy) {
		if err := q.SetSandboxTemplateEgress(ctx, db.SetSandboxTemplateEgressParams{TemplateID: row.TemplateID, EgressPolicy: policy}); err != nil {
			return nil, err
		}
		row.EgressPolicy = policy
	}
	ready, err := warmReady(ctx, q, row.TemplateID)
	if err != nil {
		return nil, err
	}
	return output(row, ready[row.TemplateID])
}

// Delete answers sandboxTemplates.delete.
func (s *Service) Delete(ctx context.Context, in *api.SandboxTemplatesDeleteInput) (*api.SandboxTemplateDeleted, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	t, err := load(ctx, q, in.TenantID, in.TemplateID, true)
	if err != nil {
		return nil, err
	}
	if _, err := q.DeleteSandboxTemplate(ctx, t.TemplateID); err != nil {
		return nil, err
	}
	// It leaves the projection; its name is free again.
	if err := sess.Projection().Delete(ctx, tx, iam.Ref{Type: sess.TypePrefix() + ResourceType, ID: t.TemplateID}); err != nil {
		return nil, err
	}
	return &api.SandboxTemplateDeleted{Deleted: true}, nil
}
