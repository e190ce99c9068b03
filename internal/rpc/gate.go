package rpc

import (
	"context"

	"computeplane/gen/api"
)

// PublicOnly is the gate of a deployment without an identity port: public
// methods run, every other method is UNAUTHENTICATED, before any identity
// call, whether or not a credential was presented.
type PublicOnly struct{}

// Admit implements Gate.
func (PublicOnly) Admit(ctx context.Context, call *Call) (context.Context, error) {
	if call.Method.Kind == api.KindPublic {
		return ctx, nil
	}
	if call.Credential == "" {
		return nil, api.Errorf(api.CodeUnauthenticated, "a credential is required: Authorization: Bearer <token>")
	}
	return nil, api.Errorf(api.CodeUnauthenticated, "the credential could not be authenticated")
}
