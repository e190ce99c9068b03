// Package system implements the system group: the deployment's description
// of itself (version) and the caller's view of itself (whoami).
package system

import (
	"context"

	"computeplane/gen/api"
	"computeplane/internal/buildinfo"
	"computeplane/internal/iam"
)

// Service implements api.SystemService.
type Service struct {
	doc    api.ServerDocument
	checks []Check
}

var _ api.SystemService = (*Service)(nil)

// Gateway is what the server document says about a configured gateway.
type Gateway struct {
	URL, ServerName, ServingCAPin string
}

// New returns the system service of a deployment served under basePath.
func New(basePath string, gw *Gateway) *Service {
	return &Service{doc: Document(basePath, gw)}
}

// Document is the server document of system.version and the well-known route.
func Document(basePath string, gw *Gateway) api.ServerDocument {
	doc := api.ServerDocument{
		Name:     buildinfo.Name,
		Version:  buildinfo.Version(),
		BasePath: basePath,
		AgentProtocol: api.AgentProtocol{
			Min: buildinfo.AgentProtocolMin,
			Max: buildinfo.AgentProtocolMax,
		},
	}
	if gw != nil && gw.URL != "" {
		info := &api.GatewayInfo{URL: gw.URL}
		if gw.ServerName != "" {
			info.ServerName = &gw.ServerName
		}
		if gw.ServingCAPin != "" {
			info.ServingCaPin = &gw.ServingCAPin
		}
		doc.Gateway = info
	}
	return doc
}

// Version answers system.version.
func (s *Service) Version(context.Context, *api.SystemVersionInput) (*api.ServerDocument, error) {
	doc := s.doc
	return &doc, nil
}

// Whoami answers system.whoami: authenticated false without a valid
// credential; otherwise the caller, never its session id.
func (s *Service) Whoami(ctx context.Context, _ *api.SystemWhoamiInput) (*api.Caller, error) {
	sess := iam.SessionFromContext(ctx)
	if sess == nil {
		return &api.Caller{Authenticated: false}, nil
	}
	c := sess.Caller
	out := &api.Caller{
		Authenticated: true,
		IdentityID:    &c.IdentityID,
		IdentityKind:  &c.IdentityKind,
		TenantID:      &c.TenantID,
		SessionKind:   &c.SessionKind,
		MFA:           &c.MFA,
	}
	if c.AgentID != "" {
		out.AgentID = &c.AgentID
	}
	if c.DelegationID != "" {
		out.DelegationID = &c.DelegationID
	}
	return out, nil
}
