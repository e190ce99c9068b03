-- Sandboxes, their attachments and snapshots, and the instances (warm and
-- sandbox kinds) they run in.

-- name: InsertSandboxInstance :one
-- A warm instance or a sandbox's VM: memory in a shared file, an identity
-- of generation 1.
INSERT INTO instances (instance_id, tenant_id, pool_id, node_id, booking_id, flavor, image_id, boot, name, user_data,
    vcpu, memory_mib, disk_gib, desired_state, state, created_by, idem_request,
    kind, template_id, hostname, machine_id, env, identity_generation, memory_file, restore_snapshot, volumes)
VALUES (sqlc.arg(instance_id), sqlc.arg(tenant_id), sqlc.arg(pool_id), sqlc.arg(node_id), sqlc.arg(booking_id), sqlc.arg(flavor),
    sqlc.arg(image_id), sqlc.arg(boot), sqlc.arg(name), sqlc.narg(user_data), sqlc.arg(vcpu), sqlc.arg(memory_mib),
    sqlc.arg(disk_gib), sqlc.arg(desired_state), 'pending', sqlc.arg(created_by), '{}',
    sqlc.arg(kind), sqlc.arg(template_id), sqlc.arg(hostname), sqlc.arg(machine_id), sqlc.arg(env), 1, true,
    sqlc.narg(restore_snapshot), sqlc.narg(volumes))
RETURNING *;

-- name: ClaimWarmInstanceOfTemplate :one
-- The oldest ready warm instance of a template (paused, its guest
-- checked), taken in one statement: concurrent claims skip each other's
-- (SKIP LOCKED), and the one taken becomes the sandbox's VM with a new
-- identity generation (hostname, machine id, env) and desired running.
-- Sent in sandboxes.create's first pipeline, before the template's answer
-- is back: the template is read in the same statement
-- (the tenant's, live, without volumes: such a template keeps no warm
-- pool), the env is the template's with the call's over it, the VM takes
-- the template's egress policy as it is now under network egress, and
-- nothing is claimed for a sandbox id that exists (a replay answers what
-- it made).
UPDATE instances i SET kind = 'sandbox', desired_state = 'running', name = sqlc.arg(name), hostname = sqlc.arg(hostname),
    machine_id = sqlc.arg(machine_id), env = t.env || sqlc.arg(env)::jsonb,
    egress_policy = CASE WHEN i.network = 'egress' THEN t.egress_policy ELSE i.egress_policy END,
    identity_generation = i.identity_generation + 1,
    identity_ready_at = NULL, created_by = sqlc.arg(created_by), version = i.version + 1, updated_at = now()
FROM sandbox_templates t,
     (SELECT w.instance_id FROM instances w
      WHERE w.kind = 'warm' AND w.template_id = sqlc.arg(template_id) AND w.desired_state = 'paused' AND w.state = 'paused'
        AND w.reported_identity = w.identity_generation
      ORDER BY w.created_at, w.instance_id
      LIMIT 1
      FOR UPDATE OF w SKIP LOCKED) c
WHERE i.instance_id = c.instance_id
  AND t.template_id = sqlc.arg(template_id) AND t.tenant_id = sqlc.arg(tenant_id) AND NOT t.deleted AND t.volumes = '[]'::jsonb
  AND NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.sandbox_id = sqlc.arg(sandbox_id))
RETURNING i.*;

-- name: WarmInstances :many
-- A template's live warm instances, newest first.
SELECT * FROM instances WHERE kind = 'warm' AND template_id = sqlc.arg(template_id) AND desired_state <> 'deleted'
ORDER BY created_at DESC, instance_id DESC;

-- name: SandboxesJobDue :one
-- Whether the sandboxes reconciler has anything to do: a sandbox past its
-- TTL, or a template whose warm pool is off (a failed warm instance,
-- fewer healthy than warm.min, more than warm.max, a deleted template
-- that still has some). One statement, so that a pass with nothing to do
-- costs one round trip instead of a fenced transaction per template.
SELECT EXISTS (SELECT 1 FROM sandboxes s WHERE s.deleted_at IS NULL AND s.expires_at <= now())::boolean AS expired,
    EXISTS (SELECT 1 FROM sandbox_templates t
            CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE w.state <> 'failed') AS healthy,
                                       count(*) FILTER (WHERE w.state = 'failed') AS failed
                                FROM instances w
                                WHERE w.kind = 'warm' AND w.template_id = t.template_id AND w.desired_state <> 'deleted') p
            WHERE (t.deleted AND p.healthy + p.failed > 0)
               OR (NOT t.deleted AND (p.failed > 0 OR p.healthy < t.warm_min OR p.healthy > t.warm_max)))::boolean AS warm;

-- name: WarmTemplates :many
-- Templates whose warm pool the reconciler looks at: live ones, and
-- deleted ones that still have warm instances.
SELECT t.* FROM sandbox_templates t
WHERE NOT t.deleted
   OR EXISTS (SELECT 1 FROM instances i WHERE i.kind = 'warm' AND i.template_id = t.template_id AND i.desired_state <> 'deleted')
ORDER BY t.template_id;

-- name: InsertSandbox :one
INSERT INTO sandboxes (sandbox_id, tenant_id, template_id, from_snapshot, instance_id, pool_id, node_id, how,
    max_ttl_seconds, expires_at, created_by, idem_request, created_at)
VALUES (sqlc.arg(sandbox_id), sqlc.arg(tenant_id), sqlc.arg(template_id), sqlc.narg(from_snapshot), sqlc.arg(instance_id),
    sqlc.arg(pool_id), sqlc.arg(node_id), sqlc.arg(how), sqlc.arg(max_ttl_seconds), sqlc.arg(expires_at),
    sqlc.arg(created_by), sqlc.arg(idem_request), sqlc.arg(created_at))
ON CONFLICT (sandbox_id) DO NOTHING
RETURNING *;

-- name: GetSandbox :one
SELECT * FROM sandboxes WHERE sandbox_id = sqlc.arg(sandbox_id);

-- GetSandboxWithVM is a sandbox with its VM's row, in one round trip (a
-- wait re-reads it).
-- name: GetSandboxWithVM :one
SELECT sqlc.embed(s), sqlc.embed(i) FROM sandboxes s JOIN instances i ON i.instance_id = s.instance_id
WHERE s.sandbox_id = sqlc.arg(sandbox_id);

-- name: GetSandboxForUpdate :one
SELECT * FROM sandboxes WHERE sandbox_id = sqlc.arg(sandbox_id) FOR UPDATE;

-- GetSandboxVMForUpdate is a sandbox's VM's row, locked: it follows
-- GetSandboxForUpdate in one pipeline (the sandbox's row locked first).
-- name: GetSandboxVMForUpdate :one
SELECT * FROM instances WHERE instance_id = (SELECT s.instance_id FROM sandboxes s WHERE s.sandbox_id = sqlc.arg(sandbox_id)) FOR UPDATE;

-- name: ListSandboxes :many
SELECT * FROM sandboxes
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(template_id)::text IS NULL OR template_id = sqlc.narg(template_id))
  AND (sqlc.arg(include_deleted)::boolean OR deleted_at IS NULL)
ORDER BY created_at DESC, sandbox_id
LIMIT 1000;

-- name: SandboxInstances :many
SELECT * FROM instances WHERE instance_id = ANY(sqlc.arg(ids)::text[]);

-- name: SetSandboxExpiry :one
UPDATE sandboxes SET expires_at = sqlc.arg(expires_at) WHERE sandbox_id = sqlc.arg(sandbox_id) RETURNING *;

-- name: DeleteSandbox :one
UPDATE sandboxes SET deleted_at = now(), delete_reason = sqlc.arg(reason)
WHERE sandbox_id = sqlc.arg(sandbox_id) AND deleted_at IS NULL
RETURNING *;

-- name: SandboxReady :one
-- The sandbox of an instance whose identity just checked out is ready
-- (the first time); no row when it is deleted.
UPDATE sandboxes SET ready_at = coalesce(ready_at, sqlc.arg(at))
WHERE instance_id = sqlc.arg(instance_id) AND deleted_at IS NULL
RETURNING *;

-- name: SandboxesReadyOfStatus :many
-- The sandboxes of a node's VMs that a daemon's status reports running
-- with their identity checked out, ready (the first time): sent in the
-- status's first round trip after the instances' update, whose rows it
-- sees (SandboxReady's work without a round trip of its own).
UPDATE sandboxes s SET ready_at = i.identity_ready_at
FROM instances i
WHERE i.instance_id = ANY(sqlc.arg(instance_ids)::text[]) AND i.node_id = sqlc.arg(node_id)::text
  AND i.kind = 'sandbox' AND i.state = 'running' AND i.desired_state = 'running'
  AND i.reported_identity = i.identity_generation AND i.identity_ready_at IS NOT NULL
  AND s.instance_id = i.instance_id AND s.ready_at IS NULL AND s.deleted_at IS NULL
RETURNING s.*;

-- name: SandboxOfInstance :one
SELECT * FROM sandboxes WHERE instance_id = sqlc.arg(instance_id);

-- name: ExpiredSandboxes :many
SELECT * FROM sandboxes WHERE deleted_at IS NULL AND expires_at <= now()
ORDER BY expires_at LIMIT sqlc.arg(lim) FOR UPDATE SKIP LOCKED;

-- name: LiveSandboxesOfTemplate :one
SELECT count(*) FROM sandboxes WHERE template_id = sqlc.arg(template_id) AND deleted_at IS NULL;

-- name: InsertAttachment :exec
INSERT INTO sandbox_attachments (sandbox_id, volume_id, mount_path, read_only)
VALUES (sqlc.arg(sandbox_id), sqlc.arg(volume_id), sqlc.arg(mount_path), sqlc.arg(read_only));

-- name: LiveAttachments :many
-- A volume's live attachments (its row is locked by the caller).
SELECT * FROM sandbox_attachments WHERE volume_id = sqlc.arg(volume_id) AND NOT released;

-- name: SandboxAttachments :many
SELECT a.*, v.serial FROM sandbox_attachments a JOIN sandbox_volumes v USING (volume_id)
WHERE a.sandbox_id = sqlc.arg(sandbox_id) ORDER BY a.mount_path;

-- name: ReleaseAttachments :exec
UPDATE sandbox_attachments SET released = true WHERE sandbox_id = sqlc.arg(sandbox_id);

-- name: VolumeAttached :one
SELECT EXISTS (SELECT 1 FROM sandbox_attachments WHERE volume_id = sqlc.arg(volume_id) AND NOT released);

-- name: InsertSnapshot :one
INSERT INTO sandbox_snapshots (snapshot_id, tenant_id, sandbox_id, node_id, keep, state, command_id, created_by, idem_request)
VALUES (sqlc.arg(snapshot_id), sqlc.arg(tenant_id), sqlc.arg(sandbox_id), sqlc.arg(node_id), sqlc.arg(keep), 'creating',
    sqlc.arg(command_id), sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT (snapshot_id) DO NOTHING
RETURNING *;

-- name: GetSnapshot :one
SELECT * FROM sandbox_snapshots WHERE snapshot_id = sqlc.arg(snapshot_id);

-- name: GetSnapshotForUpdate :one
SELECT * FROM sandbox_snapshots WHERE snapshot_id = sqlc.arg(snapshot_id) FOR UPDATE;

-- name: ListSnapshots :many
SELECT * FROM sandbox_snapshots
WHERE tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(sandbox_id)::text IS NULL OR sandbox_id = sqlc.narg(sandbox_id))
  AND (sqlc.arg(include_deleted)::boolean OR state <> 'deleted')
ORDER BY created_at DESC, snapshot_id
LIMIT 1000;

-- name: FinishSnapshot :one
-- A snapshot's command result: ready with its size, or failed.
UPDATE sandbox_snapshots SET state = sqlc.arg(state), error = sqlc.narg(error), size_bytes = sqlc.narg(size_bytes),
    paused_ms = sqlc.narg(paused_ms), ready_at = CASE WHEN sqlc.arg(state)::text = 'ready' THEN now() ELSE NULL END
WHERE command_id = sqlc.arg(command_id) AND state = 'creating'
RETURNING *;

-- name: DeleteSnapshotRow :one
UPDATE sandbox_snapshots SET state = 'deleted', deleted_at = now()
WHERE snapshot_id = sqlc.arg(snapshot_id) AND state <> 'deleted'
RETURNING *;

-- name: UnkeptSnapshots :many
SELECT * FROM sandbox_snapshots WHERE sandbox_id = sqlc.arg(sandbox_id) AND NOT keep AND state <> 'deleted' FOR UPDATE;

-- name: GetCommandResult :one
SELECT state, result FROM node_commands WHERE command_id = sqlc.arg(command_id);
