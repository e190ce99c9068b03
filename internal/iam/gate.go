package iam

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/idem"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// CookieName is the identity service's session cookie.
const CookieName = "iam_session"

// unavailableRetryMs is the retry hint when the identity service is down.
const unavailableRetryMs = 1000

// Gate puts authentication and the one decision on every call (rpc.Gate).
type Gate struct {
	Port       Port
	TypePrefix string
	// AcceptCookie accepts the session cookie on same-origin requests from
	// Origin (the configured baseURL's origin).
	AcceptCookie bool
	Origin       string
}

var (
	_ rpc.Gate     = (*Gate)(nil)
	_ rpc.Finisher = (*Gate)(nil)
)

// Admit implements rpc.Gate in the specification's order: a credential
// (none on a non-public method is UNAUTHENTICATED before any identity call),
// authentication, the tenant pre-check, then one decision: Require for
// mutations, Authorize for reads.
func (g *Gate) Admit(ctx context.Context, call *rpc.Call) (context.Context, error) {
	cred, err := g.credential(call)
	if err != nil {
		return nil, err
	}
	m := call.Method
	if m.Kind == api.KindPublic {
		// A presented credential is passed along: whoami reports it.
		if cred.Token != "" {
			if caller, err := g.Port.Authenticate(ctx, cred); err == nil {
				ctx = withCaller(ctx, &Session{Caller: caller, gate: g})
			}
		}
		return ctx, nil
	}
	if cred.Token == "" {
		return nil, api.Errorf(api.CodeUnauthenticated, "a credential is required: Authorization: Bearer <token>")
	}
	caller, err := g.Port.Authenticate(ctx, cred)
	if err != nil {
		return nil, g.refusal(err)
	}
	root := g.Port.RootTenant()
	res := g.resource(m, call.Fields, caller)
	if m.TenantScoped {
		if t := call.TenantID(); caller.TenantID != t && caller.TenantID != root {
			return nil, api.Errorf(api.CodeAccessDenied, "%s on %s refused: tenant %s may not act in tenant %s", m.Action, describe(res), caller.TenantID, t)
		}
	}
	s := &Session{Caller: caller, Resource: res, gate: g}
	if m.Resource.Draft {
		return g.admit(ctx, call, s, true)
	}
	if err := g.decide(ctx, m, caller, res); err != nil {
		// Only a refusal asks whether the object is another tenant's, so
		// the allowed path costs no projection lookup.
		if nf := g.visible(ctx, m, res); nf != nil {
			return nil, nf
		}
		return nil, err
	}
	return withCaller(ctx, s), nil
}

func (g *Gate) decide(ctx context.Context, m *api.Method, caller *Caller, res Resource) error {
	var err error
	if m.Kind == api.KindMutation {
		err = g.Port.Require(ctx, caller, m.Action, res)
	} else {
		err = g.Port.Authorize(ctx, caller, m.Action, res)
	}
	return g.decision(m, res, err)
}

// decision is the envelope's answer for the port's decision err on res.
func (g *Gate) decision(m *api.Method, res Resource, err error) error {
	if errors.Is(err, ErrDenied) {
		// Say what was refused: the action and the resource the call named
		// (or its tenant). Nothing the port said about why goes out: it may
		// speak of another tenant's objects, which visible answers as
		// absent before this message is seen.
		return api.Errorf(api.CodeAccessDenied, "%s on %s refused", m.Action, describe(res))
	}
	if err != nil {
		return g.refusal(err)
	}
	return nil
}

// describe names a resource as type/id, the form identity policies use.
func describe(r Resource) string {
	if r.ID == "" {
		return r.Type
	}
	return r.Type + "/" + r.ID
}

// visible answers NOT_FOUND, instead of the refusal, for a call naming an
// object the projection holds in another tenant (or only as a draft): the
// specification answers other tenants' objects as absent. Shared platform
// objects are visible to every tenant's reads. An object the projection
// does not hold is left to the decision and then to the method, which
// knows whether it exists.
func (g *Gate) visible(ctx context.Context, m *api.Method, res Resource) error {
	switch m.Resource.Type {
	case "tenant", "fleet":
		return nil
	}
	if res.ID == "" {
		return nil
	}
	obj, err := g.Port.Projection().Get(ctx, Ref{Type: res.Type, ID: res.ID})
	if err != nil {
		return g.refusal(err)
	}
	if obj == nil {
		return nil
	}
	root := g.Port.RootTenant()
	switch {
	case obj.Draft:
	case obj.TenantID == res.TenantID:
		return nil
	case m.Kind == api.KindRead && obj.TenantID == root && obj.Attributes[AttrShared] == "true":
		return nil
	case res.TenantID == "" || res.TenantID == root:
		return nil // the fleet operators name objects of every tenant
	}
	return api.Errorf(api.CodeNotFound, "%s %s not found in tenant %s", m.Resource.Type, res.ID, res.TenantID)
}

// admit is admission of a create: the object it would make is written as a
// draft with its attributes to the projection, the decision is made (on the
// draft when the method decides on the new object itself), and a refusal
// drops the draft so nothing is left. A retry of a create whose derived id
// already exists is answered by the method without a second decision.
// With head, a port that can (HeadDrafter) does all this at the head of
// the call's transaction instead (admitInTx).
func (g *Gate) admit(ctx context.Context, call *rpc.Call, s *Session, head bool) (context.Context, error) {
	m, caller := call.Method, s.Caller
	tenant := s.Resource.TenantID
	if t := str(call.Fields["tenantId"]); t != "" {
		tenant = t
	}
	draft := Resource{
		Type:       g.TypePrefix + m.Resource.Creates,
		TenantID:   tenant,
		Owner:      caller.IdentityID,
		Attributes: s.Resource.Attributes,
		Draft:      true,
	}
	if p := s.Resource.Parent; p != nil {
		draft.Parent = p
	} else if m.Resource.Creates != m.Resource.Type {
		draft.Parent = &Ref{Type: s.Resource.Type, ID: s.Resource.ID}
	}
	// An optional key left out derives nothing: the method makes a new id.
	if id := m.Idempotency; id != nil && id.DerivesID != "" && str(call.Fields[id.Key]) != "" {
		draft.ID = DerivedID(m, tenant, caller.IdentityID, str(call.Fields[id.Key]))
		if draft.Attributes == nil {
			draft.Attributes = map[string]string{}
		}
		target := s.Resource
		if m.Resource.Creates == m.Resource.Type {
			target = draft
		}
		// A delegated caller's decision reads its delegation: the head
		// could not decide it.
		if hd, ok := g.Port.(HeadDrafter); ok && head && call.InTx && m.Kind == api.KindMutation && caller.DelegationID == "" {
			if ctx, ok := g.admitInTx(ctx, hd, call, s, draft, target); ok {
				return ctx, nil
			}
		}
		// The draft is written first: it never touches a real resource, so
		// only a retry (the id is real) pays for reading what exists. A
		// port that can decides in the same round trip (DraftRequirer).
		dr, pipelined := g.Port.(DraftRequirer)
		pipelined = pipelined && m.Kind == api.KindMutation
		for tries := 0; ; tries++ {
			var drafted bool
			var err error
			if pipelined && tries == 0 {
				var out DraftOutcome
				out, err = dr.PutDraftRequire(ctx, draft, caller, m.Action, target)
				drafted = out.Drafted
				if err == nil && drafted {
					if err := g.decision(m, target, out.Refusal); err != nil {
						g.dropDraft(ctx, draft)
						return nil, err
					}
					s.Draft = &draft
					s.Resource = draft
					return withCaller(ctx, s), nil
				}
			} else {
				drafted, err = g.Port.Projection().PutDraft(ctx, draft)
			}
			if err != nil {
				return nil, g.refusal(err)
			}
			if drafted {
				break
			}
			existing, err := g.Port.Projection().Get(ctx, Ref{Type: draft.Type, ID: draft.ID})
			if err != nil {
				return nil, g.refusal(err)
			}
			if existing != nil && !existing.Draft {
				s.Replay = true
				s.Resource = *existing
				return withCaller(ctx, s), nil
			}
			if tries > 0 { // the real one came and went twice: let the caller retry
				return nil, g.refusal(ErrUnavailable)
			}
		}
	}
	if draft.ID == "" {
		// Without a derived id there is no object to draft before the
		// method makes one: decide on what the method asks for.
		if err := g.decide(ctx, m, caller, s.Resource); err != nil {
			return nil, err
		}
		return withCaller(ctx, s), nil
	}
	target := s.Resource
	if m.Resource.Creates == m.Resource.Type {
		target = draft
	}
	if err := g.decide(ctx, m, caller, target); err != nil {
		g.dropDraft(ctx, draft)
		return nil, err
	}
	s.Draft = &draft
	s.Resource = draft
	return withCaller(ctx, s), nil
}

// admitInTx puts the create's admission at the head of the call's
// transaction (store.Head): the draft's write and the decision's reads go
// out after BEGIN in the pipeline of the method's first statements, and
// the decision is made when their results came, before the method sees
// any. A refusal fails the transaction (what the method's statements did
// is rolled back) and is the call's answer (settle). A retry finds the
// real resource there and the method answers it, undecided, as in admit.
// What the head cannot decide (the decision needs another read) fails the
// transaction too, and the call runs again admitted as admit does without
// a head.
func (g *Gate) admitInTx(ctx context.Context, hd HeadDrafter, call *rpc.Call, s *Session, draft, target Resource) (context.Context, bool) {
	m := call.Method
	h := &store.Head{}
	outcome, ok := hd.QueueDraftRequire(&h.Pipeline, draft, s.Caller, m.Action, target)
	if !ok {
		return nil, false
	}
	p := &pendingAdmission{before: *s}
	h.Check = func(ctx context.Context) error {
		out, err := outcome(ctx)
		switch {
		case err == nil && !out.Drafted && out.Existing != nil:
			// A retry: the method answers what exists, and nothing is
			// decided, as admit does.
			s.Replay, s.Resource, s.Draft = true, *out.Existing, nil
			p.decided = true
			return nil
		case errors.Is(err, ErrNeedsReads) || err == nil && !out.Drafted:
			return errUndecided
		case err != nil:
			p.refusal = g.refusal(err)
		default:
			p.refusal = g.decision(m, target, out.Refusal)
		}
		p.decided = true
		return p.refusal
	}
	s.Draft, s.Resource, s.pending = &draft, draft, p
	ctx = rpc.WithSettle(withCaller(ctx, s), func(ctx context.Context, err error) (context.Context, bool, error) {
		return g.settle(ctx, call, err)
	})
	return store.WithHead(ctx, h), true
}

// pendingAdmission is a create's admission put at the head of its
// transaction (admitInTx), decided once the head's results came.
type pendingAdmission struct {
	decided bool
	refusal error   // the decision's refusal, nil when admitted
	before  Session // the session as admission found it
}

// errUndecided fails a transaction whose head could not decide the call.
var errUndecided = errors.New("iam: the admission is made again without a head")

// settle is rpc.Settle for a call admitted at the head of its
// transaction, which failed with err: a refusal is the answer (the
// method's own error, which the refusal caused, is not), an admitted
// call's error stands, and a call the head did not decide (it could not,
// or the transaction ended before the head's results came) is admitted as
// it was before heads (a retry of the create then finds its object and
// replays it) and runs again.
func (g *Gate) settle(ctx context.Context, call *rpc.Call, err error) (context.Context, bool, error) {
	s := SessionFromContext(ctx)
	if s == nil || s.pending == nil {
		return ctx, false, err
	}
	p := s.pending
	switch {
	case p.decided && p.refusal != nil:
		return ctx, false, p.refusal
	case p.decided:
		return ctx, false, err
	}
	again := p.before
	actx, aerr := g.admit(store.WithHead(ctx, nil), call, &again, false)
	if aerr != nil {
		return ctx, false, aerr
	}
	return actx, true, nil
}

func (g *Gate) dropDraft(ctx context.Context, d Resource) {
	// Best effort: a draft left by a crash is only a draft, never decided
	// on as real, and a retry writes it again.
	_ = g.Port.Projection().DropDraft(context.WithoutCancel(ctx), Ref{Type: d.Type, ID: d.ID})
}

// Finish implements rpc.Finisher: a create that failed after admission
// drops its draft; one that committed made it real in its transaction.
func (g *Gate) Finish(ctx context.Context, err error) {
	// A draft written in the call's transaction went with its rollback.
	if s := SessionFromContext(ctx); s != nil && s.Draft != nil && s.pending == nil && err != nil {
		g.dropDraft(ctx, *s.Draft)
	}
}

// DerivedID is the id an idempotent create derives from its tenant, the
// calling identity and its idempotency key.
func DerivedID(m *api.Method, tenant, identity, key string) string {
	return idem.ID(m, tenant, identity, key)
}

// credential reads the bearer token or, when accepted, the session cookie
// of a same-origin request.
func (g *Gate) credential(call *rpc.Call) (Credential, error) {
	r := call.Request
	cred := Credential{Token: call.Credential, SourceIP: SourceIPFromContext(r.Context()), RequestID: call.RequestID}
	if cred.Token != "" || !g.AcceptCookie {
		return cred, nil
	}
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		return cred, nil
	}
	if !sameOrigin(r, g.Origin) {
		return Credential{}, api.Errorf(api.CodeUntrustedOrigin, "cookie requests must come from %s", g.Origin)
	}
	cred.Token, cred.Cookie = ck.Value, true
	return cred, nil
}

// sameOrigin checks Origin (or, without it, Referer) against the baseURL's
// origin, both normalized (case of scheme and host, default ports). The
// envelope has already required X-Service: 1.
func sameOrigin(r *http.Request, origin string) bool {
	want, ok := normalizeOrigin(origin)
	if !ok {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	got, ok := normalizeOrigin(o)
	return ok && got == want
}

// normalizeOrigin reduces a URL to scheme://host[:port] in lower case,
// without the scheme's default port.
func normalizeOrigin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if (u.Scheme == "http" && port == "80") || (u.Scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return strings.ToLower(u.Scheme) + "://" + host, true
}

// resource builds the resource the decision is made on from the registry
// row and the input: the first alternate whose condition holds, else the
// main resource. Fleet-wide resources belong to the root tenant.
func (g *Gate) resource(m *api.Method, fields map[string]any, caller *Caller) Resource {
	ref := m.Resource.ResourceRef
	for _, a := range m.Resource.Alternates {
		v, ok := fields[a.WhenField]
		if !ok || v == nil {
			continue
		}
		if s, _ := v.(string); len(a.WhenIn) == 0 || slices.Contains(a.WhenIn, s) {
			ref = a.ResourceRef
			break
		}
	}
	r := Resource{Type: g.TypePrefix + ref.Type, ID: idOf(ref, fields), TenantID: str(fields["tenantId"])}
	if ref.Type == "fleet" {
		r.TenantID = g.Port.RootTenant()
	}
	if r.TenantID == "" {
		r.TenantID = caller.TenantID
	}
	if p := m.Resource.Parent; p != nil {
		r.Parent = &Ref{Type: g.TypePrefix + p.Type, ID: idOf(*p, fields)}
	}
	if len(m.Resource.Attributes) > 0 {
		r.Attributes = map[string]string{}
		for _, a := range m.Resource.Attributes {
			if s := str(fields[a]); s != "" {
				r.Attributes[a] = s
			}
		}
	}
	return r
}

func idOf(ref api.ResourceRef, fields map[string]any) string {
	if ref.IDField == "global" {
		return "global"
	}
	return str(fields[ref.IDField])
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// refusal maps a port error to the envelope's code.
func (g *Gate) refusal(err error) error {
	var conf *ConfirmationRequired
	switch {
	case errors.As(err, &conf):
		details := map[string]any{
			"confirmationId": conf.ConfirmationID,
			"action":         conf.Action,
			"resource":       map[string]string{"type": conf.Resource.Type, "id": conf.Resource.ID},
		}
		if !conf.ExpiresAt.IsZero() {
			details["expiresAt"] = wire.Time(conf.ExpiresAt)
		}
		return api.Errorf(api.CodeConfirmationRequired, "%s needs a confirmation", conf.Action).WithDetails(details)
	case errors.Is(err, ErrUnauthenticated):
		return api.Errorf(api.CodeUnauthenticated, "the credential is not valid")
	case errors.Is(err, ErrDenied):
		return api.Errorf(api.CodeAccessDenied, "access denied")
	case errors.Is(err, ErrUnavailable):
		return api.Errorf(api.CodeUnavailable, "the identity service is unavailable").
			WithDetails(map[string]any{"retryAfterMs": unavailableRetryMs})
	}
	return err
}

// Session is the authenticated caller of a call, with the decisions a
// business function may still need (list methods decide items one by one).
type Session struct {
	Caller *Caller
	// Resource is what the call was decided on; for an admitted create, the
	// draft of the new object, so the audit row names what was made.
	Resource Resource
	// Draft is the admitted create's draft; the method makes it real with
	// Projection().Put in its transaction (see MakeReal).
	Draft *Resource
	// Replay is set when a create's derived id exists already: the method
	// returns what exists, and no decision was made.
	Replay bool
	gate   *Gate
	// pending is an admission at the head of the call's transaction.
	pending *pendingAdmission
}

// MakeReal writes the admitted draft as a real resource in the call's
// transaction, with the attributes the method settled on.
func (s *Session) MakeReal(ctx context.Context, tx pgx.Tx, attrs map[string]string) error {
	if s.Draft == nil {
		return errors.New("iam: no admitted draft to make real")
	}
	r := *s.Draft
	r.Draft = false
	if attrs != nil {
		r.Attributes = attrs
	}
	return s.gate.Port.Projection().Put(ctx, tx, r)
}

// Projection is the port's projection, for methods that update or delete
// what they made.
func (s *Session) Projection() Projection { return s.gate.Port.Projection() }

// TypePrefix is the configured prefix of resource types.
func (s *Session) TypePrefix() string { return s.gate.TypePrefix }

// CanRead decides a read of one item; lists leave out what it refuses.
func (s *Session) CanRead(ctx context.Context, action, typ, id, tenant string) bool {
	return s.gate.Port.Authorize(ctx, s.Caller, action, Resource{Type: s.gate.TypePrefix + typ, ID: id, TenantID: tenant}) == nil
}

type sessionKey struct{}

func withCaller(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// SessionFromContext returns the call's authenticated session, nil when the
// call is anonymous.
func SessionFromContext(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionKey{}).(*Session)
	return s
}

// CallFromContext is what a group's business function works with: the
// authenticated session and the call's transaction with its queries. It
// fails outside an authenticated call (a wiring error, answered as
// INTERNAL_ERROR).
func CallFromContext(ctx context.Context) (*Session, pgx.Tx, *db.Queries, error) {
	s := SessionFromContext(ctx)
	tx, ok := store.TxFromContext(ctx)
	if s == nil || !ok {
		return nil, nil, nil, errors.New("iam: a business function ran outside an authenticated call")
	}
	return s, tx, db.New(tx), nil
}
