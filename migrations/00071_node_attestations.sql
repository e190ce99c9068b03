-- +goose Up
-- node_attestations (issue 27): what a join attestor proved of a node when
-- it joined. For the TPM attestor: the SHA-256 of the TPM's endorsement
-- public key (PKIX DER, an enrolled one), of the attestation key that
-- quoted, and of the node key the quote bound (the certificate request's).
CREATE TABLE node_attestations (
    node_id text PRIMARY KEY REFERENCES nodes (node_id),
    attestor text NOT NULL CHECK (attestor IN ('tpm')),
    endorsement_key_sha256 text NOT NULL CHECK (endorsement_key_sha256 ~ '^[0-9a-f]{64}$'),
    attestation_key_sha256 text NOT NULL,
    node_key_sha256 text NOT NULL,
    attested_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX node_attestations_ek_idx ON node_attestations (endorsement_key_sha256);

-- +goose Down
DROP TABLE node_attestations;
