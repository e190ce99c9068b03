package spicedb

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
)

// Follow keeps SpiceDB's role bindings in step with the keeper's until ctx
// ends: it reconciles everything once it knows where the identity inbox
// ends, then writes the bindings of each identity a role.changed event
// names (the keeper writes one when a binding is made or changed), within
// the inbox's delay (at once when wake, the notifier's iam.TopicInbox,
// delivers; every at most). Authentication never writes. A write SpiceDB
// refuses makes the next call reconcile everything first (Ready), so an
// outage loses no change. Every process that decides runs it: the writes
// are idempotent and each reads the keeper's binding as it is then.
func (p *Port) Follow(ctx context.Context, in iam.Inbox, every time.Duration, wake <-chan struct{}) {
	start := func(ctx context.Context) { p.reconcile(ctx, every) }
	iam.FollowInbox(ctx, in, start, func(e iam.Event) { p.followEvent(ctx, e) }, every, wake, p.log)
}

// reconcile writes the schema and mirrors every record again, tried
// every `every` until it succeeds or ctx ends (a SpiceDB slow or down at
// start): the events after the inbox's end wait for it, as they must.
func (p *Port) reconcile(ctx context.Context, every time.Duration) {
	p.forgetReady()
	for {
		err := p.Ready(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		p.log.WarnContext(ctx, "SpiceDB not reconciled yet; trying again", "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// forgetReady makes the next call reconcile everything before it decides.
func (p *Port) forgetReady() {
	p.mu.Lock()
	p.ready = false
	p.mu.Unlock()
}

func (p *Port) isReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

func (p *Port) followEvent(ctx context.Context, e iam.Event) {
	if e.Type != embedded.EventRoleChanged || e.IdentityID == "" {
		return
	}
	if !p.isReady() {
		// The reconcile reads every binding, this one included.
		_ = p.Ready(ctx)
		return
	}
	if err := p.MirrorBinding(ctx, e.IdentityID); err != nil && ctx.Err() == nil {
		p.forgetReady()
		p.log.WarnContext(ctx, "role binding not mirrored into SpiceDB; reconciling at the next call",
			"identity", e.IdentityID, "error", err.Error())
	}
}

// MirrorBinding makes SpiceDB hold exactly the role the keeper binds
// identity to in its tenant (none when it holds none).
func (p *Port) MirrorBinding(ctx context.Context, identity string) error {
	ident, err := p.st.Queries().IAMGetIdentity(ctx, identity)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no identity, no binding
	}
	if err != nil {
		return unavailable("read identity", err)
	}
	role, err := p.keeper.RoleOf(ctx, ident.TenantID, identity)
	if err != nil {
		return err
	}
	return p.write(ctx, "mirror role binding", p.bindingUpdates(ident.TenantID, identity, role))
}
