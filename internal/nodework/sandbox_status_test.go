package nodework_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/nodework"
	"computeplane/internal/sandboxes"
	"computeplane/internal/store"
	"computeplane/internal/uow"
)

// TestSandboxReadyJoinsTheFirstRoundTrip: the status that reports a
// sandbox's VM running with its identity (a claim's or a boot's end)
// makes the sandbox ready and writes its event with no round trip of its
// own: one round trip before the commit, where the ready write after the
// moved row cost a second. A later status of the same running VM (no
// longer the first) writes nothing.
func TestSandboxReadyJoinsTheFirstRoundTrip(t *testing.T) {
	st := fixture(t)
	ctx := t.Context()
	for _, sql := range []string{
		`insert into sandbox_templates (template_id, tenant_id, name, pool_id, flavor, image_id, runtime, default_ttl_seconds, max_ttl_seconds,
		   warm_min, warm_max, network, owner) values ('tmpl', 'acme', 't', 'pool_t', 'f', 'i', 'vm', 60, 60, 0, 0, 'none', 'acme')`,
		`insert into instances (instance_id, tenant_id, pool_id, node_id, flavor, image_id, boot, name, vcpu, memory_mib, disk_gib,
		   desired_state, state, created_by, idem_request, kind, identity_generation)
		 values ('sbx-vm', 'acme', 'pool_t', 'n1', 'f', 'i', '{}', 's', 1, 256, 1, 'running', 'starting', 'test', '{}', 'sandbox', 2)`,
		`insert into sandboxes (sandbox_id, tenant_id, template_id, instance_id, pool_id, node_id, how, max_ttl_seconds, expires_at,
		   created_by, idem_request, created_at) values ('sbx-1', 'acme', 'tmpl', 'sbx-vm', 'pool_t', 'n1', 'warm', 60, now() + interval '1 minute', 'test', '{}', now())`,
	} {
		_, err := st.Pool().Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var reg nodework.Registry
	sandboxes.RegisterStatus(&reg)
	status := func(identity int64) *agentproto.Status {
		vm := running("sbx-vm", 0, 0)
		vm.Identity = identity
		return &agentproto.Status{Instances: []agentproto.InstanceStatus{running("vps-a", 0, 0), vm}}
	}
	apply := func(s *agentproto.Status) (int64, bool) {
		var trips atomic.Int64
		var events bool
		// As the gateway writes a status: one unit of work, whose events
		// travel with the commit.
		_, err := uow.Run(store.CountRoundTrips(ctx, &trips), st, false, func(ctx context.Context, u *uow.Unit) error {
			var err error
			events, err = reg.ApplyStatus(ctx, u.Tx, "n1", s, nil, nil)
			return err
		})
		require.NoError(t, err)
		return trips.Load(), events
	}
	runningEvents := func() (n int) {
		require.NoError(t, st.Pool().QueryRow(ctx, `select count(*) from outbox where type = 'sandbox.running' and subject = 'sbx-1'`).Scan(&n))
		return n
	}
	ready := func() (r bool) {
		require.NoError(t, st.Pool().QueryRow(ctx, `select ready_at is not null from sandboxes where sandbox_id = 'sbx-1'`).Scan(&r))
		return r
	}

	// Running with the previous identity: not ready yet.
	trips, events := apply(status(1))
	assert.False(t, events)
	assert.False(t, ready())
	assert.Equal(t, int64(2), trips, "the status's round trip and the commit")

	trips, events = apply(status(2))
	assert.True(t, events)
	assert.True(t, ready())
	assert.Equal(t, 1, runningEvents())
	assert.Equal(t, int64(2), trips, "the ready write and its event went with the status's round trip and the commit")

	trips, events = apply(status(2))
	assert.False(t, events, "nothing moved")
	assert.Equal(t, 1, runningEvents())
	assert.Equal(t, int64(2), trips)
}

// TestSandboxStatusHandsOverTheMovedSandbox: the status that makes a
// sandbox's VM run with its identity offers the moved sandbox to its
// waits (they answer without a re-read) and wakes them; the claimed VM's
// starting wakes none of them (no wait ends on it) and offers nothing.
func TestSandboxStatusHandsOverTheMovedSandbox(t *testing.T) {
	st := fixture(t)
	ctx := t.Context()
	for _, sql := range []string{
		`insert into sandbox_templates (template_id, tenant_id, name, pool_id, flavor, image_id, runtime, default_ttl_seconds, max_ttl_seconds,
		   warm_min, warm_max, network, owner) values ('tmpl', 'acme', 't', 'pool_t', 'f', 'i', 'vm', 60, 60, 0, 0, 'none', 'acme')`,
		`insert into instances (instance_id, tenant_id, pool_id, node_id, flavor, image_id, boot, name, vcpu, memory_mib, disk_gib,
		   desired_state, state, created_by, idem_request, kind, identity_generation)
		 values ('sbx-vm', 'acme', 'pool_t', 'n1', 'f', 'i', '{}', 's', 1, 256, 1, 'running', 'paused', 'test', '{}', 'sandbox', 2)`,
		`insert into sandboxes (sandbox_id, tenant_id, template_id, instance_id, pool_id, node_id, how, max_ttl_seconds, expires_at,
		   created_by, idem_request, created_at) values ('sbx-1', 'acme', 'tmpl', 'sbx-vm', 'pool_t', 'n1', 'warm', 60, now() + interval '1 minute', 'test', '{}', now())`,
	} {
		_, err := st.Pool().Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var reg nodework.Registry
	sandboxes.RegisterStatus(&reg)
	apply := func(vm agentproto.InstanceStatus) (wakes []string, offers []uow.Offer) {
		u, err := uow.Run(ctx, st, false, func(ctx context.Context, u *uow.Unit) error {
			_, err := reg.ApplyStatus(ctx, u.Tx, "n1", &agentproto.Status{Instances: []agentproto.InstanceStatus{running("vps-a", 0, 0), vm}}, nil, nil)
			return err
		})
		require.NoError(t, err)
		return u.Wakes(), u.Offers()
	}
	topic := nodework.InstanceTopic("sbx-vm")

	wakes, offers := apply(agentproto.InstanceStatus{ID: "sbx-vm", State: agentproto.StateStarting, Identity: 1})
	assert.NotContains(t, wakes, topic, "starting ends no wait")
	assert.Empty(t, offers)

	vm := running("sbx-vm", 0, 0)
	vm.Identity = 2
	wakes, offers = apply(vm)
	assert.Contains(t, wakes, topic)
	require.Len(t, offers, 1, "the moved sandbox, for the waits of this process")
	assert.Equal(t, topic, offers[0].Topic)
	assert.NotNil(t, offers[0].Value)
}
