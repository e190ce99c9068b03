-- Support bundles: rows follow the node commands that collect and upload
-- them; command_state is the state of the bundle's current command, so a
-- bundle whose node never answered reads as failed.

-- name: InsertSupportBundle :one
INSERT INTO support_bundles (bundle_id, tenant_id, node_id, pool_id, state, max_bytes, object_key, command_id, created_by, idem_request)
VALUES (sqlc.arg(bundle_id), sqlc.arg(tenant_id), sqlc.arg(node_id), sqlc.arg(pool_id), 'collecting', sqlc.arg(max_bytes),
    sqlc.arg(object_key), sqlc.arg(command_id), sqlc.arg(created_by), sqlc.arg(idem_request))
ON CONFLICT (bundle_id) DO NOTHING
RETURNING bundle_id;

-- name: GetSupportBundle :one
SELECT sqlc.embed(b), c.state AS command_state
FROM support_bundles b JOIN node_commands c ON c.command_id = b.command_id
WHERE b.bundle_id = sqlc.arg(bundle_id);

-- name: LockSupportBundle :one
SELECT bundle_id FROM support_bundles WHERE bundle_id = sqlc.arg(bundle_id) FOR UPDATE;

-- name: ListSupportBundles :many
SELECT sqlc.embed(b), c.state AS command_state
FROM support_bundles b JOIN node_commands c ON c.command_id = b.command_id
WHERE b.tenant_id = sqlc.arg(tenant_id)
  AND (sqlc.narg(node_id)::text IS NULL OR b.node_id = sqlc.narg(node_id))
  AND (sqlc.arg(include_deleted)::boolean OR b.state <> 'deleted')
ORDER BY b.created_at DESC, b.bundle_id
LIMIT 1000;

-- name: SupportBundleByCommand :one
SELECT * FROM support_bundles WHERE command_id = sqlc.arg(command_id) FOR UPDATE;

-- name: CollectedSupportBundle :exec
-- The node collected it: its size, digest and redactions, and the upload
-- command it goes on with.
UPDATE support_bundles SET state = 'uploading', size_bytes = sqlc.arg(size_bytes), sha256 = sqlc.arg(sha256),
    redactions = sqlc.arg(redactions), command_id = sqlc.arg(upload_command_id)
WHERE bundle_id = sqlc.arg(bundle_id) AND state = 'collecting';

-- name: FinishSupportBundle :exec
-- Ready (uploaded) or failed, with what the node reported.
UPDATE support_bundles SET state = sqlc.arg(state), error = sqlc.narg(error),
    size_bytes = coalesce(sqlc.narg(size_bytes), size_bytes), sha256 = coalesce(sqlc.narg(sha256), sha256),
    redactions = coalesce(sqlc.narg(redactions), redactions),
    ready_at = CASE WHEN sqlc.arg(state)::text = 'ready' THEN now() ELSE NULL END
WHERE bundle_id = sqlc.arg(bundle_id) AND state IN ('collecting', 'uploading');

-- name: DeleteSupportBundleRow :exec
UPDATE support_bundles SET state = 'deleted', deleted_at = now()
WHERE bundle_id = sqlc.arg(bundle_id) AND state <> 'deleted';
