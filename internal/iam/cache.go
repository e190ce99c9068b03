package iam

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"computeplane/internal/store"
)

// Cache windows of the specification's Limits table.
const (
	CredentialTTL = 30 * time.Second
	AllowTTL      = 10 * time.Second
	// maxEntries bounds each cache; past it expired entries are swept and,
	// if that is not enough, the cache starts over (a miss is only a call).
	maxEntries = 100_000
)

// Cached wraps a Port with the two caches the specification allows:
// authenticated credentials for 30 s, keyed by a hash of the credential and
// the source address, and allowed read decisions for 10 s per session.
// Require is never cached, and neither is any refusal.
type Cached struct {
	Port
	now func() time.Time

	mu     sync.Mutex
	creds  map[credKey]credEntry
	allows map[allowKey]time.Time

	// Revocation listeners (OnRevoke), under their own lock so that React
	// never calls out while holding mu.
	subMu   sync.Mutex
	subs    map[int]func(session string)
	nextSub int
	// Event listeners (OnEvent), under subMu too.
	events map[int]func(Event)
}

type credEntry struct {
	caller  *Caller
	expires time.Time
}

// NewCached returns p behind the caches; now is the clock (time.Now when nil).
func NewCached(p Port, now func() time.Time) *Cached {
	if now == nil {
		now = time.Now
	}
	return &Cached{Port: p, now: now, creds: map[credKey]credEntry{}, allows: map[allowKey]time.Time{}}
}

// PutDraftRequire implements DraftRequirer: in one round trip when the
// port can, else PutDraft and then Require. Nothing of it is cached.
func (c *Cached) PutDraftRequire(ctx context.Context, draft Resource, caller *Caller, action string, target Resource) (DraftOutcome, error) {
	if dr, ok := c.Port.(DraftRequirer); ok {
		return dr.PutDraftRequire(ctx, draft, caller, action, target)
	}
	drafted, err := c.Port.Projection().PutDraft(ctx, draft)
	if err != nil || !drafted {
		return DraftOutcome{}, err
	}
	return DraftOutcome{Drafted: true, Refusal: c.Port.Require(ctx, caller, action, target)}, nil
}

// QueueDraftRequire implements HeadDrafter when the port does; nothing of
// it is cached.
func (c *Cached) QueueDraftRequire(p *store.Pipeline, draft Resource, caller *Caller, action string, target Resource) (func(ctx context.Context) (DraftOutcome, error), bool) {
	if hd, ok := c.Port.(HeadDrafter); ok {
		return hd.QueueDraftRequire(p, draft, caller, action, target)
	}
	return nil, false
}

var (
	_ DraftRequirer = (*Cached)(nil)
	_ HeadDrafter   = (*Cached)(nil)
)

// credKey is the SHA-256 of a credential and its source address: the
// cache holds no token, and computing it costs no allocation.
type credKey [sha256.Size]byte

func credentialKey(c Credential) credKey {
	var stack [1024]byte // tokens and addresses fit; a longer one spills to the heap
	b := append(stack[:0], c.Token...)
	b = append(b, 0)
	if c.Cookie {
		b = append(b, "cookie"...)
	}
	b = append(b, 0)
	if c.SourceIP.IsValid() {
		b = c.SourceIP.AppendTo(b)
	} else {
		b = append(b, "invalid IP"...) // what netip.Addr.String says of it
	}
	return sha256.Sum256(b)
}

// Authenticate answers from the cache when the same credential came from the
// same address within CredentialTTL.
func (c *Cached) Authenticate(ctx context.Context, cred Credential) (*Caller, error) {
	key := credentialKey(cred)
	now := c.now()
	c.mu.Lock()
	e, ok := c.creds[key]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		caller := *e.caller
		return &caller, nil
	}
	caller, err := c.Port.Authenticate(ctx, cred)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.creds) >= maxEntries {
		sweep(c.creds, now, func(e credEntry) time.Time { return e.expires })
	}
	stored := *caller
	c.creds[key] = credEntry{caller: &stored, expires: now.Add(CredentialTTL)}
	c.mu.Unlock()
	return caller, nil
}

// allowKey is what an allow is cached under: a struct of the strings the
// decision was made on, so that a lookup builds no key (no allocation).
type allowKey struct {
	session, action, typ, id, tenant string
}

func allowKeyOf(caller *Caller, action string, r Resource) allowKey {
	return allowKey{session: caller.Session, action: action, typ: r.Type, id: r.ID, tenant: r.TenantID}
}

// Authorize answers an allow from the cache for AllowTTL per session.
func (c *Cached) Authorize(ctx context.Context, caller *Caller, action string, r Resource) error {
	key := allowKeyOf(caller, action, r)
	now := c.now()
	c.mu.Lock()
	exp, ok := c.allows[key]
	c.mu.Unlock()
	if ok && now.Before(exp) {
		return nil
	}
	if err := c.Port.Authorize(ctx, caller, action, r); err != nil {
		return err
	}
	c.mu.Lock()
	if len(c.allows) >= maxEntries {
		sweep(c.allows, now, func(t time.Time) time.Time { return t })
	}
	c.allows[key] = now.Add(AllowTTL)
	c.mu.Unlock()
	return nil
}

// DropSession forgets everything cached for a session, as an identity event
// (a revoked credential or session) requires.
func (c *Cached) DropSession(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.creds {
		if e.caller.Session == session {
			delete(c.creds, k)
		}
	}
	for k := range c.allows {
		if k.session == session {
			delete(c.allows, k)
		}
	}
}

// OnRevoke registers fn to hear the session of every identity event React
// applies (a revoked credential or session), after the caches dropped it:
// open streams (/watch) close on it. fn runs on React's goroutine and must
// not block. The returned stop unregisters fn.
func (c *Cached) OnRevoke(fn func(session string)) (stop func()) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if c.subs == nil {
		c.subs = map[int]func(string){}
	}
	id := c.nextSub
	c.nextSub++
	c.subs[id] = fn
	return func() {
		c.subMu.Lock()
		defer c.subMu.Unlock()
		delete(c.subs, id)
	}
}

// OnEvent registers fn to hear every identity event React applies (after
// the caches dropped what it revoked): open tunnels close on a revoked
// session and are decided again on an identity's role change. fn runs on
// React's goroutine and must not block. The returned stop unregisters fn.
func (c *Cached) OnEvent(fn func(Event)) (stop func()) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if c.events == nil {
		c.events = map[int]func(Event){}
	}
	id := c.nextSub
	c.nextSub++
	c.events[id] = fn
	return func() {
		c.subMu.Lock()
		defer c.subMu.Unlock()
		delete(c.events, id)
	}
}

// heard tells every event listener of e.
func (c *Cached) heard(e Event) {
	c.subMu.Lock()
	fns := make([]func(Event), 0, len(c.events))
	for _, fn := range c.events {
		fns = append(fns, fn)
	}
	c.subMu.Unlock()
	for _, fn := range fns {
		fn(e)
	}
}

// revoked tells every listener that session was revoked.
func (c *Cached) revoked(session string) {
	c.subMu.Lock()
	fns := make([]func(string), 0, len(c.subs))
	for _, fn := range c.subs {
		fns = append(fns, fn)
	}
	c.subMu.Unlock()
	for _, fn := range fns {
		fn(session)
	}
}

func sweep[K comparable, V any](m map[K]V, now time.Time, expires func(V) time.Time) {
	for k, v := range m {
		if !now.Before(expires(v)) {
			delete(m, k)
		}
	}
	if len(m) >= maxEntries {
		clear(m)
	}
}
