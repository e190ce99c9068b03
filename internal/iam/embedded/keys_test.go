package embedded

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/iam"
)

var tokenShape = regexp.MustCompile(`^cpk_[0-9a-hjkmnp-tv-z]{16}_[0-9a-hjkmnp-tv-z]{32}$`)

func TestKeyLifecycle(t *testing.T) {
	s, st, _ := newTestService(t)
	ctx := context.Background()

	token, keyID, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Identity: "alice@acme", Role: RoleMember, MFA: true})
	require.NoError(t, err)
	require.Regexp(t, tokenShape, token)
	require.Equal(t, token[4:20], keyID)

	c, err := s.Authenticate(ctx, iam.Credential{Token: token, SourceIP: netip.MustParseAddr("192.0.2.7"), RequestID: "req_1"})
	require.NoError(t, err)
	assert.Equal(t, &iam.Caller{
		IdentityID:   "alice@acme",
		IdentityKind: KindUser,
		TenantID:     "acme",
		SessionKind:  "api-key",
		MFA:          true,
		Session:      "key:" + keyID,
	}, c)

	// The same token from the session cookie is the same key.
	c2, err := s.Authenticate(ctx, iam.Credential{Token: token, Cookie: true})
	require.NoError(t, err)
	assert.Equal(t, c, c2)

	// The token is stored only as its SHA-256.
	rows, err := st.Queries().IAMKeyRowsText(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	secret := token[21:]
	for _, row := range rows {
		assert.NotContains(t, row, token)
		assert.NotContains(t, row, secret)
	}
	sum := sha256.Sum256([]byte(token))
	assert.Contains(t, rows[0], `\x`+hex.EncodeToString(sum[:]))

	// Wrong, malformed and unknown tokens.
	other := []byte(token)
	if other[len(other)-1] == 'a' {
		other[len(other)-1] = 'b'
	} else {
		other[len(other)-1] = 'a'
	}
	for _, bad := range []string{
		"", "cpk_", token + "0", strings.ToUpper(token), string(other),
		"cpk_" + keyID + "-" + secret, "xpk_" + token[4:],
		"cpk_" + keyID + "_" + strings.Repeat("i", 32), // i is not Crockford
		"Bearer " + token,
	} {
		_, err := s.Authenticate(ctx, iam.Credential{Token: bad})
		assert.ErrorIs(t, err, iam.ErrUnauthenticated, "token %q", bad)
	}

	keys, err := s.ListKeys(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, keys, 1)
	assert.Equal(t, keyID, keys[0].KeyID)
	assert.Equal(t, RoleMember, keys[0].Role)
	assert.True(t, keys[0].MFA)
	assert.Nil(t, keys[0].RevokedAt)
	assert.Equal(t, epoch, keys[0].CreatedAt.UTC())

	// Revoked: unauthenticated, one event in the inbox with the session.
	require.NoError(t, s.RevokeKey(ctx, keyID))
	_, err = s.Authenticate(ctx, iam.Credential{Token: token})
	assert.ErrorIs(t, err, iam.ErrUnauthenticated)
	require.NoError(t, s.RevokeKey(ctx, keyID), "revoking twice")
	events, err := s.Next(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, events, 2)
	// The key's creation bound the role: a role change (SpiceDB
	// decisions learn bindings from the inbox).
	assert.Equal(t, EventRoleChanged, events[0].Type)
	assert.Equal(t, "alice@acme", events[0].IdentityID)
	assert.Empty(t, events[0].Session)
	assert.Equal(t, EventCredentialRevoked, events[1].Type)
	assert.Equal(t, "alice@acme", events[1].IdentityID)
	assert.Equal(t, "key:"+keyID, events[1].Session)
	assert.Equal(t, epoch, events[1].At.UTC())
	assert.True(t, strings.HasPrefix(events[1].ID, "iev_"))

	keys, err = s.ListKeys(ctx, "")
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.NotNil(t, keys[0].RevokedAt)

	assert.ErrorIs(t, s.RevokeKey(ctx, "0000000000000000"), ErrKeyNotFound)
}

func TestCreateKeyBindings(t *testing.T) {
	s, _, _ := newTestService(t)
	ctx := context.Background()

	mustKey(t, s, KeyRequest{Tenant: "acme", Identity: "bob", Role: RoleAdmin, Kind: KindService})
	// Same role again: a second key, the binding is unchanged.
	c := mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "bob", Role: RoleAdmin})
	assert.Equal(t, KindService, c.IdentityKind, "an existing identity keeps its kind")

	_, _, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Identity: "bob", Role: RoleViewer})
	assert.ErrorIs(t, err, ErrConflict, "another role")
	_, _, err = s.CreateKey(ctx, KeyRequest{Tenant: "other", Identity: "bob", Role: RoleAdmin})
	assert.ErrorIs(t, err, ErrConflict, "identity of another tenant")

	for _, bad := range []KeyRequest{
		{Tenant: "", Identity: "x", Role: RoleOwner},
		{Tenant: "a b", Identity: "x", Role: RoleOwner},
		{Tenant: strings.Repeat("t", 129), Identity: "x", Role: RoleOwner},
		{Tenant: "t", Identity: "x/y", Role: RoleOwner},
		{Tenant: "t", Identity: strings.Repeat("i", 129), Role: RoleOwner},
		{Tenant: "t", Identity: "x", Role: "root"},
		{Tenant: "t", Identity: "x", Role: RoleOwner, Kind: "robot"},
		{Tenant: "t", Identity: "x", Role: RoleOwner, Confirm: []string{"compute:a:b"}},
		{Tenant: "t", Identity: "x", Role: RoleOwner, Agent: "bot", Confirm: []string{"compute:A:b"}},
		{Tenant: "t", Identity: "x", Role: RoleOwner, Agent: "bot", Confirm: []string{"sites:manage"}},
		{Tenant: "t", Identity: "x", Role: RoleOwner, Agent: "b o t"},
	} {
		_, _, err := s.CreateKey(ctx, bad)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", bad)
	}
	keys, err := s.ListKeys(ctx, "")
	require.NoError(t, err)
	assert.Len(t, keys, 2, "refused requests leave nothing")

	// An agent key: the identity's delegation to the agent.
	token := mustKey(t, s, KeyRequest{Tenant: "acme", Identity: "carol", Role: RoleMember, Agent: "bot-1",
		Confirm: []string{"compute:sites:manage", "compute:sandboxes:manage", "compute:sites:manage"}})
	c, err = s.Authenticate(ctx, iam.Credential{Token: token})
	require.NoError(t, err)
	assert.Equal(t, "carol", c.IdentityID)
	assert.Equal(t, "bot-1", c.AgentID)
	assert.True(t, strings.HasPrefix(c.DelegationID, "dlg_"))
	keys, err = s.ListKeys(ctx, "acme")
	require.NoError(t, err)
	require.Len(t, keys, 3)
	i := slices.IndexFunc(keys, func(k KeyInfo) bool { return k.KeyID == token[4:20] })
	require.GreaterOrEqual(t, i, 0)
	assert.Equal(t, []string{"compute:sandboxes:manage", "compute:sites:manage"}, keys[i].ConfirmActions)
	assert.Equal(t, c.DelegationID, keys[i].DelegationID)
	assert.Equal(t, "bot-1", keys[i].AgentID)
}

func TestEnsureRootAdminKey(t *testing.T) {
	s, _, _ := newTestService(t)
	ctx := context.Background()

	// Processes starting together make one key between them.
	var wg sync.WaitGroup
	tokens := make([]string, 4)
	created := make([]bool, 4)
	errs := make([]error, 4)
	for i := range tokens {
		wg.Go(func() { tokens[i], created[i], errs[i] = s.EnsureRootAdminKey(ctx) })
	}
	wg.Wait()
	var token string
	for i := range tokens {
		require.NoError(t, errs[i])
		if created[i] {
			require.Empty(t, token, "a second key was created")
			token = tokens[i]
		} else {
			assert.Empty(t, tokens[i])
		}
	}
	require.NotEmpty(t, token)
	c, err := s.Authenticate(ctx, iam.Credential{Token: token})
	require.NoError(t, err)
	assert.Equal(t, "root", c.TenantID)
	assert.Equal(t, RootAdminIdentity, c.IdentityID)
	require.NoError(t, s.Require(ctx, c, "compute:fleet:admin", iam.Resource{Type: "compute-fleet", ID: "global"}))

	again, ok, err := s.EnsureRootAdminKey(ctx)
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Empty(t, again)

	// Revoked: a new one is made.
	require.NoError(t, s.RevokeKey(ctx, token[4:20]))
	token2, ok, err := s.EnsureRootAdminKey(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.NotEqual(t, token, token2)

	// A live admin key of another identity is enough; a member key is not.
	s2, _, _ := newTestService(t)
	mustKey(t, s2, KeyRequest{Tenant: "root", Identity: "ops", Role: RoleMember})
	_, ok, err = s2.EnsureRootAdminKey(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "a member key does not count")
	s3, _, _ := newTestService(t)
	mustKey(t, s3, KeyRequest{Tenant: "root", Identity: "ops", Role: RoleAdmin})
	_, ok, err = s3.EnsureRootAdminKey(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "an admin key counts")
}

func TestInboxPaging(t *testing.T) {
	s, _, clk := newTestService(t)
	ctx := context.Background()
	var sessions []string
	for range 5 {
		_, keyID, err := s.CreateKey(ctx, KeyRequest{Tenant: "acme", Identity: "alice", Role: RoleViewer})
		require.NoError(t, err)
		clk.Add(1)
		require.NoError(t, s.RevokeKey(ctx, keyID))
		sessions = append(sessions, "key:"+keyID)
	}

	// The first key bound alice's role (role.changed, no session); the
	// others found it bound.
	sessions = append([]string{""}, sessions...)
	var got []string
	after := ""
	for _, want := range []int{2, 2, 2, 0} {
		page, err := s.Next(ctx, after, 2)
		require.NoError(t, err)
		require.Len(t, page, want)
		for _, e := range page {
			got = append(got, e.Session)
			after = e.ID
		}
	}
	assert.Equal(t, sessions, got, "in order, each once")

	all, err := s.Next(ctx, "", 0)
	require.NoError(t, err)
	assert.Len(t, all, 6, "limit 0 takes the default")

	_, err = s.Next(ctx, "iev_unknown", 10)
	assert.Error(t, err)
}

func TestAuthenticateUnavailable(t *testing.T) {
	s, _, _ := newTestService(t)
	token := mustKey(t, s, KeyRequest{Tenant: "acme", Identity: "alice", Role: RoleViewer})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Authenticate(ctx, iam.Credential{Token: token})
	assert.ErrorIs(t, err, iam.ErrUnavailable)
	assert.NotErrorIs(t, err, iam.ErrUnauthenticated)
}

func FuzzParseToken(f *testing.F) {
	tok, _ := newToken()
	for _, seed := range []string{tok, "", "cpk_", "cpk_0123456789abcdef_0123456789abcdefghjkmnpqrstvwxyz", "cpk_\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keyID, ok := parseToken(s)
		if !ok {
			return
		}
		if !tokenShape.MatchString(s) || keyID != s[4:20] {
			t.Fatalf("parseToken accepted %q (key id %q)", s, keyID)
		}
	})
}
