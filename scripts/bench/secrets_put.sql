-- The statements one secrets.put commits on an existing secret, with the
-- same shapes and sizes: lock the head, write the new version, then the
-- audit row and the outbox row in one statement, as the envelope does.
-- pgbench runs it as the physical limit of the call.
\set n random(0, 63)
BEGIN;
SELECT * FROM secrets WHERE reference = 'secret://tenants/bench/bench-' || :n FOR UPDATE;
WITH head AS (
    UPDATE secrets
    SET version = version + 1, idem_key = 'pgbench-' || gen_random_uuid(), store = 'database', deleted = false, updated_at = now()
    WHERE secrets.reference = 'secret://tenants/bench/bench-' || :n
    RETURNING reference, version
)
INSERT INTO secret_versions (reference, version, nonce, sealed, created_by)
SELECT head.reference, head.version, '\x000102030405060708090a0b'::bytea,
       '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899aabbcc'::bytea, 'bench'
FROM head;
WITH audit AS (
    INSERT INTO audit_log (tenant_id, identity_id, identity_kind, agent_id, delegation_id, method,
                           resource_type, resource_id, request_id, traceparent, outcome)
    VALUES ('bench', 'bench', 'user', NULL, NULL, 'secrets.put', 'compute-secret',
            'secret://tenants/bench/bench-' || :n, 'req_pgbench', NULL, 'ok')
)
INSERT INTO outbox (id, type, source, subject, tenant_id, data, request_id, traceparent)
VALUES ('evt_' || gen_random_uuid(), 'security.secret.put', 'computeplane/secrets',
        'secret://tenants/bench/bench-' || :n, 'bench',
        ('{"reference":"secret://tenants/bench/bench-' || :n || '","name":"bench-' || :n || '","version":2}')::jsonb,
        'req_pgbench', NULL);
COMMIT;
