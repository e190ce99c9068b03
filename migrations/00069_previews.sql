-- +goose Up
-- Preview URLs (docs/tunnels.md, "Preview URLs"): a guest port of a
-- sandbox or instance served over HTTP through the tunnel path. A row
-- exists once the tenant asked for a port's preview; its token is an HMAC
-- of the deployment's secret over the target, the port and nonce (never
-- stored), so a new nonce (the row made again) voids the old token.
CREATE TABLE previews (
    target_id text NOT NULL,
    port integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    tenant_id text NOT NULL,
    target_kind text NOT NULL CHECK (target_kind IN ('sandbox', 'instance')),
    public boolean NOT NULL DEFAULT false,
    nonce bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target_id, port)
);
CREATE INDEX previews_tenant ON previews (tenant_id);

-- +goose Down
DROP TABLE previews;
