package iam

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"

	"computeplane/gen/api"
	"computeplane/internal/rpc"
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

var _ rpc.Gate = (*Gate)(nil)

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
	if m.TenantScoped {
		if t := call.TenantID(); caller.TenantID != t && caller.TenantID != root {
			return nil, api.Errorf(api.CodeAccessDenied, "the caller's tenant may not act in tenant %s", t)
		}
	}
	res := g.resource(m, call.Fields, caller)
	s := &Session{Caller: caller, Resource: res, gate: g}
	if m.Kind == api.KindMutation {
		err = g.Port.Require(ctx, caller, m.Action, res)
	} else {
		err = g.Port.Authorize(ctx, caller, m.Action, res)
	}
	if err != nil {
		return nil, g.refusal(err)
	}
	return withCaller(ctx, s), nil
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
// origin. The envelope has already required X-Service: 1.
func sameOrigin(r *http.Request, origin string) bool {
	if o := r.Header.Get("Origin"); o != "" {
		return o == origin
	}
	ref, err := url.Parse(r.Header.Get("Referer"))
	if err != nil || ref.Scheme == "" {
		return false
	}
	return ref.Scheme+"://"+ref.Host == origin
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
			details["expiresAt"] = conf.ExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z")
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
	// Resource is what the call was decided on; a create that makes a new
	// id sets it so the audit row names what was made.
	Resource Resource
	gate     *Gate
}

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
