// Package embedded is the default identity service: it keeps tenants,
// identities, hashed API keys, role bindings, delegations, the
// authorization projection and its relationships, the identity inbox and
// the billing bridge in the service's own PostgreSQL, in schema iam
// (migrations/00002_iam.sql), and implements iam.Port and iam.Inbox on
// them. It also owns the operator commands (computed iam create-key,
// revoke-key, list-keys) and the root admin key printed on first start.
//
// The policy it decides is written down in docs/identity.md.
package embedded

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Defaults used when New is given empty values.
const (
	DefaultRootTenant = "root"
	DefaultTypePrefix = "compute-"
)

// SessionKindAPIKey is the session kind of every caller this service
// authenticates: it issues API keys and no interactive sessions.
const SessionKindAPIKey = "api-key"

// Token shape: cpk_<key id>_<secret>, both parts lowercase Crockford
// base32 from crypto/rand (80 and 160 bits).
const (
	tokenPrefix = "cpk_"
	keyIDLen    = 16
	secretLen   = 32
	tokenLen    = len(tokenPrefix) + keyIDLen + 1 + secretLen
)

// confirmationTTL is how long a confirmation an agent session is asked for
// stays valid.
const confirmationTTL = 10 * time.Minute

// inboxLockID serializes writers of iam.inbox (see the migration): a
// bigserial is taken at insert time but becomes visible at commit, so
// without it a reader paging by seq could pass over a row that commits
// after a higher one.
const inboxLockID int64 = 0x69616d696e626f78 // "iaminbox"

// rootKeyLockID serializes EnsureRootAdminKey across processes starting
// together, so that a fresh install prints exactly one root key.
const rootKeyLockID int64 = 0x69616d726f6f746b // "iamrootk"

// crockford is Crockford's base32 alphabet in lower case (no i, l, o, u).
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

var b32 = base32.NewEncoding(crockford).WithPadding(base32.NoPadding)

// Shapes of the names this service accepts.
var (
	tenantPattern   = wire.MustPattern(`^[A-Za-z0-9._:-]{1,128}$`)
	identityPattern = wire.MustPattern(`^[A-Za-z0-9._:@-]{1,128}$`)
	actionPattern   = wire.MustPattern(`^compute:[a-z][a-z0-9-]{0,63}:[a-z][a-z0-9-]{0,63}$`)
	keyIDPattern    = wire.MustPattern(`^[0-9a-hjkmnp-tv-z]{16}$`)
)

// Service is the embedded identity service.
type Service struct {
	st     *store.Store
	root   string
	prefix string
	now    func() time.Time
}

var (
	_ iam.Port       = (*Service)(nil)
	_ iam.Inbox      = (*Service)(nil)
	_ iam.Projection = projection{}
	_ iam.Billing    = billing{}
)

// New returns the service on st. rootTenant is the tenant owning platform
// resources (default root), typePrefix the prefix of resource types
// (default compute-), now the clock (default time.Now).
func New(st *store.Store, rootTenant, typePrefix string, now func() time.Time) *Service {
	if rootTenant == "" {
		rootTenant = DefaultRootTenant
	}
	if typePrefix == "" {
		typePrefix = DefaultTypePrefix
	}
	if now == nil {
		now = time.Now
	}
	return &Service{st: st, root: rootTenant, prefix: typePrefix, now: now}
}

// RootTenant is the tenant that owns platform resources.
func (s *Service) RootTenant() string { return s.root }

// TypePrefix is the prefix resource types carry.
func (s *Service) TypePrefix() string { return s.prefix }

// Projection returns the authorization projection.
func (s *Service) Projection() iam.Projection { return projection{s} }

// Billing returns the billing bridge.
func (s *Service) Billing() iam.Billing { return billing{s} }

// Authenticate turns an API key into a caller. The key is looked up by the
// SHA-256 of the whole token, so no comparison of secrets happens here. A
// token from the session cookie is treated the same way: this service
// issues no sessions, so the cookie can only hold an API key.
func (s *Service) Authenticate(ctx context.Context, cred iam.Credential) (*iam.Caller, error) {
	keyID, ok := parseToken(cred.Token)
	if !ok {
		return nil, iam.ErrUnauthenticated
	}
	row, err := s.st.Queries().IAMKeyByHash(ctx, hashToken(cred.Token))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, iam.ErrUnauthenticated
	}
	if err != nil {
		return nil, unavailable(err)
	}
	if row.RevokedAt != nil || row.ID != keyID {
		return nil, iam.ErrUnauthenticated
	}
	return &iam.Caller{
		IdentityID:   row.IdentityID,
		IdentityKind: row.IdentityKind,
		TenantID:     row.TenantID,
		SessionKind:  SessionKindAPIKey,
		MFA:          row.Mfa,
		AgentID:      row.AgentID.String,
		DelegationID: row.DelegationID.String,
		Session:      sessionOf(row.ID),
	}, nil
}

// sessionOf names the session of an API key for the caches and the inbox.
func sessionOf(keyID string) string { return "key:" + keyID }

// parseToken checks the shape of an API key and returns its key id.
func parseToken(tok string) (string, bool) {
	if len(tok) != tokenLen || !strings.HasPrefix(tok, tokenPrefix) || tok[len(tokenPrefix)+keyIDLen] != '_' {
		return "", false
	}
	keyID := tok[len(tokenPrefix) : len(tokenPrefix)+keyIDLen]
	secret := tok[len(tokenPrefix)+keyIDLen+1:]
	if !isCrockford(keyID) || !isCrockford(secret) {
		return "", false
	}
	return keyID, true
}

func isCrockford(s string) bool {
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(crockford, s[i]) < 0 {
			return false
		}
	}
	return true
}

func hashToken(tok string) []byte {
	sum := sha256.Sum256([]byte(tok))
	return sum[:]
}

// randomBase32 returns n lowercase Crockford base32 characters from
// crypto/rand; n is a multiple of 8 (5 random bytes per 8 characters).
func randomBase32(n int) string {
	b := make([]byte, n/8*5)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return b32.EncodeToString(b)
}

// newID returns a random identifier with the given prefix.
func newID(prefix string) string { return prefix + randomBase32(16) }

// newToken returns a fresh API key and its key id.
func newToken() (token, keyID string) {
	keyID = randomBase32(keyIDLen)
	return tokenPrefix + keyID + "_" + randomBase32(secretLen), keyID
}

// unavailable marks a failure of the store as the identity service being
// unavailable (the gate answers it as such), keeping the cause.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", iam.ErrUnavailable, err)
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

// txOf returns the transaction to write in: the one given, else the call's
// transaction carried by ctx.
func txOf(ctx context.Context, tx pgx.Tx) (*db.Queries, error) {
	tx, err := txFrom(ctx, tx)
	if err != nil {
		return nil, err
	}
	return db.New(tx), nil
}

func txFrom(ctx context.Context, tx pgx.Tx) (pgx.Tx, error) {
	if tx == nil {
		var ok bool
		if tx, ok = store.TxFromContext(ctx); !ok {
			return nil, errors.New("iam: projection write without a transaction")
		}
	}
	return tx, nil
}

// IdentityOf returns the home tenant and kind of an identity; ok is false
// when the service does not know it. External authentication maps a
// token's subject to the identity by it.
func (s *Service) IdentityOf(ctx context.Context, id string) (tenant, kind string, ok bool, err error) {
	if !identityPattern.MatchString(id) {
		return "", "", false, nil
	}
	row, err := s.st.Queries().IAMGetIdentity(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, unavailable(err)
	}
	return row.TenantID, row.Kind, true, nil
}
