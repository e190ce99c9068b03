// Package secrets implements the secrets group: write-only secret storage,
// and the resolver other modules use to read a secret:// reference.
//
// A secret is named by its reference: secret://tenants/<tenantId>/<name>
// for scope tenant, secret://fleet/<name> for scope fleet (root tenant
// only). Each put writes the next version (1, 2, 3 ...). The database store
// seals every version with AES-256-GCM under keys.Derive(secret,
// keys.Secrets), a random 12-byte nonce per seal and the reference and
// version as additional data, so a sealed value cannot be moved to another
// row. Each head row records the store holding its versions.
//
// No value is ever returned, logged or published: events and audit rows
// carry only the reference, the name and the version.
//
// Rules beyond the specification's words, decided here:
//   - Retry: a put whose idempotencyKey equals the key of the put that wrote
//     the current version, with the same value, returns that version and
//     writes nothing, whoever calls (the key is not scoped to the identity).
//     The same key with another value is CONFLICT (the general Idempotency
//     rule). Values are compared by a keyed digest (HMAC-SHA256 of the
//     reference and the value under keys.SecretDigests) kept with each
//     version, never by the value; a version written before digests were
//     kept is compared by opening its sealed value. A key of an older
//     version writes a new version.
//   - Delete removes every sealed version and keeps the head as a tombstone
//     with the last version; a later put continues after it (versions of a
//     reference are never reused) and no earlier key counts as a retry.
//   - Order of refusals: INVALID_INPUT for scope fleet outside the root
//     tenant comes first, before authentication (the catalog's
//     rootTenantOnly, checked by the envelope's Precheck; reference keeps
//     the same check for callers that bypass the envelope), then the gate's
//     decision, then UNAVAILABLE (no store configured, no
//     retryAfterMs: it will not come back by waiting), INVALID_STATE (the
//     secret lives in another store; a tombstone lives nowhere).
package secrets

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/keys"
	"computeplane/internal/outbox"
	"computeplane/internal/wire"
)

// Store names (config.SecretStore values).
const (
	StoreDatabase = "database"
	StoreNone     = "none"
)

// Service implements api.SecretsService and the resolver.
type Service struct {
	root   string
	store  string // the configured store; StoreNone (or "") when none
	seal   *sealer
	digest []byte // HMAC key of value digests
}

var _ api.SecretsService = (*Service)(nil)

// New returns the secrets service of a deployment: rootTenant owns fleet
// secrets, store is the configured store (database or none) and key the
// 32-byte key derived for keys.Secrets. A key of another length panics: it
// is a wiring mistake, never an input.
func New(rootTenant, store string, key []byte) *Service {
	s, err := newSealer(key)
	if err != nil {
		panic(err)
	}
	// The digest key is derived from the secrets key under a label of its
	// own, so the two purposes never share a key.
	return &Service{root: rootTenant, store: store, seal: s, digest: keys.Derive(string(key), keys.SecretDigests)}
}

// digestOf is the keyed digest of a value, bound to its reference so equal
// values of different secrets do not show equal digests.
func (s *Service) digestOf(ref, value string) []byte {
	m := hmac.New(sha256.New, s.digest)
	m.Write([]byte(ref))
	m.Write([]byte{0})
	m.Write([]byte(value))
	return m.Sum(nil)
}

// sameValue reports whether value is the value of the stored version:
// by digest, or for a version written before digests were kept, by opening
// it.
func (s *Service) sameValue(ctx context.Context, q *db.Queries, ref string, version int64, value string) (bool, error) {
	row, err := q.GetSecretVersionCheck(ctx, db.GetSecretVersionCheckParams{Reference: ref, Version: version})
	if err != nil {
		return false, err
	}
	if row.ValueDigest != nil {
		return hmac.Equal(row.ValueDigest, s.digestOf(ref, value)), nil
	}
	plain, err := s.seal.open(ref, version, row.Nonce, row.Sealed)
	if err != nil {
		return false, err
	}
	defer clear(plain)
	return hmac.Equal(plain, []byte(value)), nil
}

// reference checks the input's scope against its tenant and returns the
// secret's reference.
func (s *Service) reference(tenant, scope, name string) (Reference, error) {
	if scope == ScopeFleet {
		if tenant != s.root {
			return Reference{}, api.Errorf(api.CodeInvalidInput, "scope: fleet secrets belong to the root tenant %s", s.root)
		}
		return Reference{Scope: ScopeFleet, Name: name}, nil
	}
	return Reference{Scope: ScopeTenant, TenantID: tenant, Name: name}, nil
}

// available is UNAVAILABLE when no store is configured.
func (s *Service) available() error {
	if s.store == "" || s.store == StoreNone {
		return api.Errorf(api.CodeUnavailable, "no secret store is configured")
	}
	return nil
}

// inStore is INVALID_STATE for a live secret another store holds.
func (s *Service) inStore(h db.Secret) error {
	if !h.Deleted && h.Store != s.store {
		return api.Errorf(api.CodeInvalidState, "secret %s lives in the %s store, not in the configured %s store", h.Reference, h.Store, s.store)
	}
	return nil
}

// audited makes the audit row name the secret rather than the tenant or
// fleet the call was decided on.
func (s *Service) audited(sess *iam.Session, ref Reference) {
	sess.Resource = iam.Resource{Type: sess.TypePrefix() + "secret", ID: ref.String(), TenantID: ref.owner(s.root)}
}

// Put answers secrets.put.
func (s *Service) Put(ctx context.Context, in *api.SecretsPutInput) (*api.SecretVersion, error) {
	ref, err := s.reference(in.TenantID, in.Scope, in.Name)
	if err != nil {
		return nil, err
	}
	if err := s.available(); err != nil {
		return nil, err
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	refText := ref.String()
	head, err := q.GetSecretForUpdate(ctx, refText)
	if errors.Is(err, pgx.ErrNoRows) {
		// The first put: the head and version 1 in one statement. A
		// concurrent first put may win the head; then lock it as below.
		created, cerr := s.create(ctx, q, sess, ref, in)
		switch {
		case cerr != nil:
			return nil, cerr
		case created:
			return s.published(ctx, tx, sess, ref, 1)
		}
		head, err = q.GetSecretForUpdate(ctx, refText)
	}
	if err != nil {
		return nil, err
	}
	if err := s.inStore(head); err != nil {
		return nil, err
	}
	if !head.Deleted && head.IdemKey.Valid && head.IdemKey.String == in.IdempotencyKey {
		// The retry of the put that wrote the current version: nothing is
		// written, nothing published. Another value under its key is no
		// retry.
		same, err := s.sameValue(ctx, q, refText, head.Version, in.Value)
		if err != nil {
			return nil, err
		}
		if !same {
			return nil, api.Errorf(api.CodeConflict, "idempotencyKey %q wrote version %d of %s with another value", in.IdempotencyKey, head.Version, refText)
		}
		s.audited(sess, ref)
		return &api.SecretVersion{Reference: refText, Version: head.Version}, nil
	}
	version := head.Version + 1
	nonce, sealed, err := s.sealValue(refText, version, in.Value)
	if err != nil {
		return nil, err
	}
	if _, err := q.WriteSecretVersion(ctx, db.WriteSecretVersionParams{
		Reference: refText, Version: version, IdemKey: key(in.IdempotencyKey), Store: s.store,
		Nonce: nonce, Sealed: sealed, CreatedBy: sess.Caller.IdentityID, ValueDigest: s.digestOf(refText, in.Value),
	}); err != nil {
		return nil, err
	}
	return s.published(ctx, tx, sess, ref, version)
}

// create writes the head at version 1 with its sealed value; created is
// false when a concurrent put created the head first.
func (s *Service) create(ctx context.Context, q *db.Queries, sess *iam.Session, ref Reference, in *api.SecretsPutInput) (created bool, err error) {
	refText := ref.String()
	nonce, sealed, err := s.sealValue(refText, 1, in.Value)
	if err != nil {
		return false, err
	}
	_, err = q.CreateSecret(ctx, db.CreateSecretParams{
		Reference: refText, TenantID: ref.owner(s.root), Scope: ref.Scope, Name: ref.Name, Store: s.store,
		IdemKey: key(in.IdempotencyKey), Nonce: nonce, Sealed: sealed, CreatedBy: sess.Caller.IdentityID,
		ValueDigest: s.digestOf(refText, in.Value),
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

func (s *Service) sealValue(ref string, version int64, value string) (nonce, sealed []byte, err error) {
	plain := []byte(value)
	defer clear(plain)
	return s.seal.seal(ref, version, plain)
}

func key(k string) pgtype.Text { return pgtype.Text{String: k, Valid: true} }

// published writes security.secret.put for a new version.
func (s *Service) published(ctx context.Context, tx pgx.Tx, sess *iam.Session, ref Reference, version int64) (*api.SecretVersion, error) {
	s.audited(sess, ref)
	out := &api.SecretVersion{Reference: ref.String(), Version: version}
	return out, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventSecuritySecretPut, Subject: out.Reference, TenantID: ref.owner(s.root),
		Data: api.SecuritySecretPutPayload{Reference: out.Reference, Name: ref.Name, Version: version},
	})
}

// List answers secrets.list: the live secrets of the tenant's scope by
// name, never a value. The call was decided on the tenant (or the fleet,
// for scope fleet).
func (s *Service) List(ctx context.Context, in *api.SecretsListInput) (*api.SecretList, error) {
	ref, err := s.reference(in.TenantID, in.Scope, "")
	if err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	after := ""
	if in.After != nil {
		after = *in.After
	}
	// One row more than the page tells whether another page follows.
	rows, err := q.ListSecrets(ctx, db.ListSecretsParams{
		TenantID: ref.owner(s.root), Scope: ref.Scope, After: after, MaxRows: int32(in.Limit) + 1,
	})
	if err != nil {
		return nil, err
	}
	out := &api.SecretList{Items: make([]api.SecretSummary, 0, min(len(rows), int(in.Limit)))}
	for i, r := range rows {
		if i == int(in.Limit) {
			next := out.Items[i-1].Name
			out.Next = &next
			break
		}
		out.Items = append(out.Items, api.SecretSummary{
			Name: r.Name, Reference: r.Reference, Version: r.Version, Store: r.Store, UpdatedAt: wire.Time(r.UpdatedAt),
		})
	}
	return out, nil
}

// Delete answers secrets.delete: every version goes; the head stays as a
// tombstone holding the last version. deleted is false when no live secret
// exists.
func (s *Service) Delete(ctx context.Context, in *api.SecretsDeleteInput) (*api.SecretDeleted, error) {
	ref, err := s.reference(in.TenantID, in.Scope, in.Name)
	if err != nil {
		return nil, err
	}
	if err := s.available(); err != nil {
		return nil, err
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	refText := ref.String()
	head, err := q.GetSecretForUpdate(ctx, refText)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && head.Deleted):
		s.audited(sess, ref)
		return &api.SecretDeleted{Deleted: false}, nil
	case err != nil:
		return nil, err
	}
	if err := s.inStore(head); err != nil {
		return nil, err
	}
	last, err := q.DeleteSecret(ctx, refText)
	if err != nil {
		return nil, err
	}
	s.audited(sess, ref)
	return &api.SecretDeleted{Deleted: true}, outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventSecuritySecretDeleted, Subject: refText, TenantID: ref.owner(s.root),
		Data: api.SecuritySecretDeletedPayload{Reference: refText, Name: ref.Name, Version: last},
	})
}

// Resolve returns the current value and version of a secret:// reference
// for a consumer acting in tenantID, reading through q (the consumer's
// transaction, or the pool). The rule: a tenant resolves its own tenant
// secrets (secret://tenants/<tenantID>/...); fleet secrets
// (secret://fleet/...) resolve only for the root tenant, which is the
// tenant fleet-level consumers (platform providers, shared pools, the
// service itself) pass. Another tenant's secret is NOT_FOUND, like one that
// does not exist or was deleted; a malformed reference is INVALID_INPUT;
// UNAVAILABLE without a store; INVALID_STATE when another store holds it.
// The caller must not log, return or publish the value, and should clear
// it when done.
func (s *Service) Resolve(ctx context.Context, q *db.Queries, tenantID, reference string) (value []byte, version int64, err error) {
	ref, err := ParseReference(reference)
	if err != nil {
		return nil, 0, api.Errorf(api.CodeInvalidInput, "%s", err.Error())
	}
	notFound := api.Errorf(api.CodeNotFound, "secret %s not found", reference)
	if ref.owner(s.root) != tenantID {
		return nil, 0, notFound
	}
	if err := s.available(); err != nil {
		return nil, 0, err
	}
	row, err := q.GetSecretValue(ctx, reference)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, 0, notFound
	case err != nil:
		return nil, 0, err
	case row.Deleted:
		return nil, 0, notFound
	case row.Store != s.store:
		return nil, 0, api.Errorf(api.CodeInvalidState, "secret %s lives in the %s store, not in the configured %s store", reference, row.Store, s.store)
	case row.Nonce == nil:
		return nil, 0, errors.New("secrets: the current version of a live secret is missing")
	}
	value, err = s.seal.open(reference, row.Version, row.Nonce, row.Sealed)
	if err != nil {
		return nil, 0, err
	}
	return value, row.Version, nil
}
