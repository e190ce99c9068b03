package testenv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"computeplane/internal/iam/embedded"
)

// KeyOption changes the API key Key and NewKey create.
type KeyOption func(*embedded.KeyRequest)

// KeyMFA marks the key as an MFA session.
func KeyMFA() KeyOption { return func(r *embedded.KeyRequest) { r.MFA = true } }

// KeyKind sets the kind (user, service, agent) of an identity created now.
func KeyKind(kind string) KeyOption { return func(r *embedded.KeyRequest) { r.Kind = kind } }

// KeyAgent makes the key an agent key: a delegation from the identity to
// agent, holding the confirm actions for confirmation.
func KeyAgent(agent string, confirm ...string) KeyOption {
	return func(r *embedded.KeyRequest) { r.Agent, r.Confirm = agent, confirm }
}

// Identity returns the embedded identity service on the env's store, with
// the env's root tenant and type prefix and the real clock, as the operator
// commands use it (create-key, revoke-key, list-keys).
func (e *Env) Identity() *embedded.Service {
	return embedded.New(e.Store, e.Config.RootTenantID, e.Config.TypePrefix, nil)
}

// Key mints an API key for identity with role in tenant (creating the
// tenant and identity when absent, as computed iam create-key does) and
// returns the token.
func (e *Env) Key(t testing.TB, tenant, identity, role string, opts ...KeyOption) string {
	t.Helper()
	token, _ := e.NewKey(t, tenant, identity, role, opts...)
	return token
}

// NewKey is Key returning the key id too (for RevokeKey).
func (e *Env) NewKey(t testing.TB, tenant, identity, role string, opts ...KeyOption) (token, keyID string) {
	t.Helper()
	req := embedded.KeyRequest{Tenant: tenant, Identity: identity, Role: role}
	for _, o := range opts {
		o(&req)
	}
	token, keyID, err := e.Identity().CreateKey(t.Context(), req)
	require.NoError(t, err)
	return token, keyID
}

// RevokeKey revokes a key as computed iam revoke-key does.
func (e *Env) RevokeKey(t testing.TB, keyID string) {
	t.Helper()
	require.NoError(t, e.Identity().RevokeKey(t.Context(), keyID))
}
