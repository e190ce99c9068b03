package provideraccounts

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/outbox"
	"computeplane/internal/providers"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Bootstrap states. identifying and claiming start it; installing mints
// the join token and has the provider deliver the daemon; joining waits
// for the daemon's node to be ready.
const (
	StateIdentifying = "identifying"
	StateClaiming    = "claiming"
	StateInstalling  = "installing"
	StateJoining     = "joining"
	StateJoined      = "joined"
	StateFailed      = "failed"
)

func bootstrapOutput(r db.ProviderBootstrap) *api.Bootstrap {
	o := &api.Bootstrap{BootstrapID: r.BootstrapID, TenantID: r.TenantID, AccountID: r.AccountID, PoolID: r.PoolID, State: r.State,
		CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt)}
	if r.MachineID.Valid {
		o.MachineID = &r.MachineID.String
	}
	if r.OfferID.Valid {
		o.OfferID = &r.OfferID.String
	}
	if r.NodeID.Valid {
		o.NodeID = &r.NodeID.String
	}
	if r.Error.Valid {
		o.Error = &r.Error.String
	}
	return o
}

// Bootstrap answers providerAccounts.bootstrap: it records the request in
// identifying (machineId) or claiming (offerId) and publishes
// provider.bootstrap.started; the reconciler (job.go) does the rest. A
// repeat returns the bootstrap as it is now.
func (s *Service) Bootstrap(ctx context.Context, in *api.ProviderAccountsBootstrapInput) (*api.Bootstrap, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(bootstrapMethod, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetProviderBootstrap(ctx, k.ID)
	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return bootstrapOutput(existing), nil
	}
	acct, err := load(ctx, q, in.TenantID, in.AccountID, false)
	if err != nil {
		return nil, err
	}
	f, ok := s.reg.Get(acct.Provider)
	if !ok {
		return nil, api.Errorf(api.CodeInvalidConfig, "provider %s of account %s is no longer registered on this service", acct.Provider, acct.AccountID)
	}
	m := f.Manifest
	switch {
	case !m.CanBootstrap():
		return nil, api.Errorf(api.CodeUnsupported, "provider %s cannot identify and bootstrap machines", acct.Provider)
	case in.MachineID != nil && !m.Can(providers.CapIdentify):
		return nil, api.Errorf(api.CodeUnsupported, "machineId: provider %s cannot identify machines", acct.Provider)
	case in.OfferID != nil && !m.Can(providers.CapClaim):
		return nil, api.Errorf(api.CodeUnsupported, "offerId: provider %s cannot claim machines", acct.Provider)
	}
	if s.bootstrap == nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "bootstrap: this service has no bootstrap options (bootstrap.agent)")
	}
	if _, err := s.bundle(); err != nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "this service has no PKI bundle to mint join tokens (computed pki init): %v", err)
	}
	pool, err := q.GetPool(ctx, in.PoolID)
	pool, err = store.Visible(pool, err, pool.TenantID == in.TenantID, api.Errorf(api.CodeNotFound, "poolId: pool %s not found", in.PoolID))
	switch {
	case err != nil:
		return nil, err
	case pool.Archived:
		return nil, api.Errorf(api.CodeInvalidState, "poolId: pool %s is archived", in.PoolID)
	case pool.Class != "vps-host" && pool.Class != "metal-host":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: pool %s is of class %s, not vps-host or metal-host", in.PoolID, pool.Class)
	case pool.Hosting != "hosted" || pool.Agent.String != "node-daemon":
		return nil, api.Errorf(api.CodeInvalidInput, "poolId: pool %s does not run the node-daemon agent", in.PoolID)
	}
	state := StateClaiming
	if in.MachineID != nil {
		state = StateIdentifying
	}
	row, err := q.InsertProviderBootstrap(ctx, db.InsertProviderBootstrapParams{BootstrapID: k.ID, TenantID: in.TenantID, AccountID: acct.AccountID,
		PoolID: in.PoolID, MachineID: text(in.MachineID), OfferID: text(in.OfferID), State: state, IdemRequest: k.Fingerprint, CreatedBy: sess.Caller.IdentityID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "a concurrent bootstrap with the same key came first; retry")
	}
	if err != nil {
		return nil, err
	}
	return bootstrapOutput(row), outbox.Write(ctx, tx, outbox.Event{
		Type: api.EventProviderBootstrapStarted, Subject: acct.AccountID, TenantID: row.TenantID,
		Data: api.ProviderBootstrapStartedPayload{AccountID: acct.AccountID, PoolID: row.PoolID, MachineID: in.MachineID, OfferID: in.OfferID, State: state},
	})
}
