package iam

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingPort answers from fixed tables and counts the calls that reach it,
// so the tests see exactly what the caches keep from the identity service.
type countingPort struct {
	mu        sync.Mutex
	valid     map[string]*Caller // token -> caller
	allowed   map[string]bool    // action -> allowed
	authCalls int
	authzCall int
	reqCalls  int
}

func (p *countingPort) RootTenant() string { return "root" }
func (p *countingPort) Authenticate(_ context.Context, c Credential) (*Caller, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.authCalls++
	if caller, ok := p.valid[c.Token]; ok {
		cp := *caller
		return &cp, nil
	}
	return nil, ErrUnauthenticated
}
func (p *countingPort) Require(_ context.Context, _ *Caller, action string, _ Resource) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqCalls++
	if p.allowed[action] {
		return nil
	}
	return ErrDenied
}
func (p *countingPort) Authorize(_ context.Context, _ *Caller, action string, _ Resource) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.authzCall++
	if p.allowed[action] {
		return nil
	}
	return ErrDenied
}
func (p *countingPort) Projection() Projection { return nil }
func (p *countingPort) Billing() Billing       { return nil }

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newCached() (*Cached, *countingPort, *fakeClock) {
	p := &countingPort{
		valid:   map[string]*Caller{"tok": {IdentityID: "alice", TenantID: "acme", Session: "key:a"}},
		allowed: map[string]bool{"compute:sites:read": true},
	}
	clk := &fakeClock{t: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)}
	return NewCached(p, clk.now), p, clk
}

func TestCredentialCacheHoldsThirtySeconds(t *testing.T) {
	t.Parallel()
	c, p, clk := newCached()
	cred := Credential{Token: "tok", SourceIP: netip.MustParseAddr("203.0.113.1")}
	for range 3 {
		_, err := c.Authenticate(t.Context(), cred)
		require.NoError(t, err)
	}
	assert.Equal(t, 1, p.authCalls)
	clk.advance(CredentialTTL - time.Millisecond)
	_, _ = c.Authenticate(t.Context(), cred)
	assert.Equal(t, 1, p.authCalls, "still cached just before 30 s")
	clk.advance(time.Millisecond)
	_, _ = c.Authenticate(t.Context(), cred)
	assert.Equal(t, 2, p.authCalls, "asked again at 30 s")
}

func TestCredentialCacheKeysOnSourceAddress(t *testing.T) {
	t.Parallel()
	c, p, _ := newCached()
	_, _ = c.Authenticate(t.Context(), Credential{Token: "tok", SourceIP: netip.MustParseAddr("203.0.113.1")})
	_, _ = c.Authenticate(t.Context(), Credential{Token: "tok", SourceIP: netip.MustParseAddr("203.0.113.2")})
	_, _ = c.Authenticate(t.Context(), Credential{Token: "tok"})
	assert.Equal(t, 3, p.authCalls)
}

func TestFailedAuthenticationIsNeverCached(t *testing.T) {
	t.Parallel()
	c, p, _ := newCached()
	for range 3 {
		_, err := c.Authenticate(t.Context(), Credential{Token: "bad"})
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	assert.Equal(t, 3, p.authCalls)
}

func TestRevocationTakesEffectWithinTheCacheWindow(t *testing.T) {
	t.Parallel()
	c, p, clk := newCached()
	cred := Credential{Token: "tok"}
	_, err := c.Authenticate(t.Context(), cred)
	require.NoError(t, err)
	p.mu.Lock()
	delete(p.valid, "tok") // revoked at the identity service
	p.mu.Unlock()
	clk.advance(CredentialTTL)
	_, err = c.Authenticate(t.Context(), cred)
	require.ErrorIs(t, err, ErrUnauthenticated, "at most 30 s after revocation")

	// An identity event drops the session at once.
	c2, p2, _ := newCached()
	_, err = c2.Authenticate(t.Context(), cred)
	require.NoError(t, err)
	delete(p2.valid, "tok")
	c2.DropSession("key:a")
	_, err = c2.Authenticate(t.Context(), cred)
	require.ErrorIs(t, err, ErrUnauthenticated)
}

func TestAllowCacheHoldsTenSecondsPerSession(t *testing.T) {
	t.Parallel()
	c, p, clk := newCached()
	alice := &Caller{IdentityID: "alice", Session: "key:a"}
	bob := &Caller{IdentityID: "bob", Session: "key:b"}
	r := Resource{Type: "compute-site", ID: "site_1", TenantID: "acme"}
	for range 3 {
		require.NoError(t, c.Authorize(t.Context(), alice, "compute:sites:read", r))
	}
	assert.Equal(t, 1, p.authzCall)
	require.NoError(t, c.Authorize(t.Context(), bob, "compute:sites:read", r))
	assert.Equal(t, 2, p.authzCall, "per session")
	require.NoError(t, c.Authorize(t.Context(), alice, "compute:sites:read", Resource{Type: "compute-site", ID: "site_2", TenantID: "acme"}))
	assert.Equal(t, 3, p.authzCall, "per resource")
	clk.advance(AllowTTL - time.Millisecond)
	require.NoError(t, c.Authorize(t.Context(), alice, "compute:sites:read", r))
	assert.Equal(t, 3, p.authzCall)
	clk.advance(time.Millisecond)
	require.NoError(t, c.Authorize(t.Context(), alice, "compute:sites:read", r))
	assert.Equal(t, 4, p.authzCall, "asked again at 10 s")
}

func TestDenialsAreNeverCached(t *testing.T) {
	t.Parallel()
	c, p, _ := newCached()
	alice := &Caller{IdentityID: "alice", Session: "key:a"}
	r := Resource{Type: "compute-site", ID: "site_1", TenantID: "acme"}
	for range 3 {
		require.ErrorIs(t, c.Authorize(t.Context(), alice, "compute:sites:manage", r), ErrDenied)
	}
	assert.Equal(t, 3, p.authzCall)
	p.mu.Lock()
	p.allowed["compute:sites:manage"] = true // granted meanwhile
	p.mu.Unlock()
	require.NoError(t, c.Authorize(t.Context(), alice, "compute:sites:manage", r), "a grant is seen at once")
}

func TestRequireIsNeverCached(t *testing.T) {
	t.Parallel()
	c, p, _ := newCached()
	alice := &Caller{IdentityID: "alice", Session: "key:a"}
	for range 3 {
		require.NoError(t, c.Require(t.Context(), alice, "compute:sites:read", Resource{}))
	}
	assert.Equal(t, 3, p.reqCalls)
}

// React tells the OnRevoke listeners the revoked session after dropping it
// from the caches; a stopped listener hears nothing more, and events
// without a session reach none.
func TestOnRevokeHearsReactedSessions(t *testing.T) {
	t.Parallel()
	c, p, _ := newCached()
	p.valid["tok"] = &Caller{IdentityID: "alice", Session: "key:a"}
	_, err := c.Authenticate(t.Context(), Credential{Token: "tok"})
	require.NoError(t, err)

	var mu sync.Mutex
	var first, second []string
	cachedWhenHeard := true
	stop1 := c.OnRevoke(func(s string) {
		mu.Lock()
		defer mu.Unlock()
		first = append(first, s)
		// The caches no longer hold the session when listeners hear it.
		c.mu.Lock()
		cachedWhenHeard = false
		for _, e := range c.creds {
			if e.caller.Session == s {
				cachedWhenHeard = true
			}
		}
		c.mu.Unlock()
	})
	stop2 := c.OnRevoke(func(s string) {
		mu.Lock()
		defer mu.Unlock()
		second = append(second, s)
	})
	defer stop2()

	c.React(Event{Type: "credential.revoked", IdentityID: "alice", Session: "key:a"})
	c.React(Event{Type: "identity.updated", IdentityID: "alice"})
	stop1()
	c.React(Event{Type: "credential.revoked", IdentityID: "bob", Session: "key:b"})

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"key:a"}, first)
	assert.Equal(t, []string{"key:a", "key:b"}, second)
	assert.False(t, cachedWhenHeard)
}

// TestCachedAllowAllocatesNothing: an allow answered from the cache, and
// the credential key a cached authentication is looked up by, cost no
// allocation (both run on every read).
func TestCachedAllowAllocatesNothing(t *testing.T) {
	c, p, _ := newCached()
	ctx := context.Background()
	alice := &Caller{IdentityID: "alice", Session: "key:a"}
	r := Resource{Type: "compute-site", ID: "site_1", TenantID: "acme"}
	require.NoError(t, c.Authorize(ctx, alice, "compute:sites:read", r))
	allocs := testing.AllocsPerRun(100, func() {
		if err := c.Authorize(ctx, alice, "compute:sites:read", r); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "a cached allow")
	assert.Equal(t, 1, p.authzCall, "answered from the cache")

	cred := Credential{Token: "tok", SourceIP: netip.MustParseAddr("192.0.2.7")}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = credentialKey(cred) }), "a credential key")
	other := cred
	other.SourceIP = netip.MustParseAddr("2001:db8::7")
	assert.NotEqual(t, credentialKey(cred), credentialKey(other), "keyed on the source address")
	other = cred
	other.Cookie = true
	assert.NotEqual(t, credentialKey(cred), credentialKey(other), "keyed on cookie or bearer")
}
