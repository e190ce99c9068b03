-- +goose Up
-- The cloud instance-identity attestor (issue 27): a node joining from a
-- provider machine presents the provider's signed identity document. Its
-- node_attestations row names the machine (instance_id), the provider
-- account and the document's SHA-256; the TPM columns stay for tpm rows.
ALTER TABLE node_attestations DROP CONSTRAINT node_attestations_attestor_check;
ALTER TABLE node_attestations ALTER COLUMN endorsement_key_sha256 DROP NOT NULL,
    ALTER COLUMN attestation_key_sha256 DROP NOT NULL,
    ALTER COLUMN node_key_sha256 DROP NOT NULL;
ALTER TABLE node_attestations ADD COLUMN instance_id text, ADD COLUMN account_id text, ADD COLUMN document_sha256 text;
ALTER TABLE node_attestations ADD CONSTRAINT node_attestations_attestor_check CHECK (
    (attestor = 'tpm' AND endorsement_key_sha256 IS NOT NULL AND attestation_key_sha256 IS NOT NULL AND node_key_sha256 IS NOT NULL)
    OR (attestor = 'cloud' AND instance_id IS NOT NULL AND account_id IS NOT NULL AND document_sha256 ~ '^[0-9a-f]{64}$'));

-- cloud_identity_documents: every identity document a join consumed, so
-- that one document never joins twice (a replay is refused). A document
-- older than the attestor's maxAge (at most 1 h) is refused anyway, so
-- rows older than a day are pruned by later joins.
CREATE TABLE cloud_identity_documents (
    document_sha256 text PRIMARY KEY CHECK (document_sha256 ~ '^[0-9a-f]{64}$'),
    instance_id text NOT NULL,
    token_id text NOT NULL, -- the join token it was presented with
    used_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX cloud_identity_documents_used_idx ON cloud_identity_documents (used_at);

-- +goose Down
DROP TABLE cloud_identity_documents;
DELETE FROM node_attestations WHERE attestor <> 'tpm';
ALTER TABLE node_attestations DROP CONSTRAINT node_attestations_attestor_check;
ALTER TABLE node_attestations DROP COLUMN instance_id, DROP COLUMN account_id, DROP COLUMN document_sha256;
ALTER TABLE node_attestations ALTER COLUMN endorsement_key_sha256 SET NOT NULL,
    ALTER COLUMN attestation_key_sha256 SET NOT NULL,
    ALTER COLUMN node_key_sha256 SET NOT NULL;
ALTER TABLE node_attestations ADD CONSTRAINT node_attestations_attestor_check CHECK (attestor IN ('tpm'));
