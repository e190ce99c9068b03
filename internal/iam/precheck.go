package iam

import (
	"context"

	"computeplane/gen/api"
	"computeplane/internal/rpc"
)

// RootTenantPrecheck is the envelope's Precheck for the catalog's
// rootTenantOnly rule: when the rule's condition holds on the body (scope
// fleet, a shared or dedicated site), a tenantId other than the root
// tenant's is INVALID_INPUT naming the field. It runs before
// authentication, as the specification orders validation, so a caller who
// would also be refused, or who sent no credential, still hears that the
// input is invalid.
func RootTenantPrecheck(root string) func(context.Context, *rpc.Call) error {
	return func(_ context.Context, call *rpc.Call) error {
		r := call.Method.Resource
		if r == nil || r.RootTenantOnly == nil || !r.RootTenantOnly.Holds(call.Fields) {
			return nil
		}
		if t := call.TenantID(); t != root {
			f := r.RootTenantOnly.Field
			return api.Errorf(api.CodeInvalidInput, "%s: %v is only for the root tenant %s, not tenant %s", f, call.Fields[f], root, t).
				WithDetails(map[string]any{"path": f})
		}
		return nil
	}
}
