-- name: InsertSandboxTemplate :one
INSERT INTO sandbox_templates (template_id, tenant_id, name, pool_id, flavor, image_id, runtime, user_data, default_ttl_seconds,
    max_ttl_seconds, warm_min, warm_max, env, network, volumes, owner)
VALUES (sqlc.arg(template_id), sqlc.arg(tenant_id), sqlc.arg(name), sqlc.arg(pool_id), sqlc.arg(flavor), sqlc.arg(image_id),
    sqlc.arg(runtime), sqlc.narg(user_data), sqlc.arg(default_ttl_seconds), sqlc.arg(max_ttl_seconds), sqlc.arg(warm_min),
    sqlc.arg(warm_max), sqlc.arg(env), sqlc.arg(network), sqlc.arg(volumes), sqlc.arg(owner))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetSandboxTemplate :one
SELECT * FROM sandbox_templates WHERE template_id = sqlc.arg(template_id) AND NOT deleted;

-- name: GetSandboxTemplateForUpdate :one
SELECT * FROM sandbox_templates WHERE template_id = sqlc.arg(template_id) AND NOT deleted FOR UPDATE;

-- name: ListSandboxTemplates :many
SELECT * FROM sandbox_templates WHERE tenant_id = sqlc.arg(tenant_id) AND NOT deleted ORDER BY name;

-- name: UpdateSandboxTemplate :one
UPDATE sandbox_templates SET flavor = sqlc.arg(flavor), image_id = sqlc.arg(image_id), user_data = sqlc.narg(user_data),
    default_ttl_seconds = sqlc.arg(default_ttl_seconds), max_ttl_seconds = sqlc.arg(max_ttl_seconds),
    warm_min = sqlc.arg(warm_min), warm_max = sqlc.arg(warm_max), env = sqlc.arg(env), network = sqlc.arg(network),
    volumes = sqlc.arg(volumes), version = version + 1, updated_at = now()
WHERE template_id = sqlc.arg(template_id)
RETURNING *;

-- name: DeleteSandboxTemplate :execrows
UPDATE sandbox_templates SET deleted = true, updated_at = now() WHERE template_id = sqlc.arg(template_id) AND NOT deleted;

-- name: SandboxVolumeByName :one
SELECT * FROM sandbox_volumes WHERE tenant_id = sqlc.arg(tenant_id) AND name = sqlc.arg(name) AND state <> 'deleted';

-- name: LiveTenantSecret :one
SELECT EXISTS (SELECT 1 FROM secrets WHERE reference = sqlc.arg(reference) AND tenant_id = sqlc.arg(tenant_id) AND NOT deleted)::boolean;

-- name: VolumeInTemplates :one
-- Whether a live template mounts the volume (sandboxVolumes.delete is
-- refused while one does).
SELECT EXISTS (SELECT 1 FROM sandbox_templates WHERE NOT deleted
    AND volumes @> jsonb_build_array(jsonb_build_object('resolved', sqlc.arg(volume_id)::text)))::boolean;

-- name: WarmReadyCounts :many
-- How many warm instances of each template are ready to be claimed now
-- (what ClaimWarmInstance takes: paused, their guest checked).
SELECT template_id::text AS template_id, count(*)::bigint AS ready FROM instances
WHERE kind = 'warm' AND template_id = ANY(sqlc.arg(template_ids)::text[]) AND desired_state = 'paused' AND state = 'paused'
  AND reported_identity = identity_generation
GROUP BY template_id;
