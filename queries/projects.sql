-- name: InsertProject :one
INSERT INTO projects (project_id, tenant_id, name, description, owner, idem_request)
VALUES (sqlc.arg(project_id), sqlc.arg(tenant_id), sqlc.arg(name), sqlc.arg(description), sqlc.arg(owner), sqlc.arg(idem_request))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetProject :one
SELECT * FROM projects WHERE project_id = sqlc.arg(project_id);

-- name: GetProjectForUpdate :one
SELECT * FROM projects WHERE project_id = sqlc.arg(project_id) FOR UPDATE;

-- name: ProjectNameTaken :one
SELECT EXISTS (SELECT 1 FROM projects WHERE tenant_id = sqlc.arg(tenant_id) AND name = sqlc.arg(name)
               AND project_id <> sqlc.arg(project_id))::boolean;

-- name: ListProjects :many
SELECT * FROM projects WHERE tenant_id = sqlc.arg(tenant_id) ORDER BY name;

-- name: UpdateProject :one
UPDATE projects SET name = sqlc.arg(name), description = sqlc.arg(description), version = version + 1, updated_at = now()
WHERE project_id = sqlc.arg(project_id)
RETURNING *;

-- name: DeleteProject :exec
DELETE FROM projects WHERE project_id = sqlc.arg(project_id);
