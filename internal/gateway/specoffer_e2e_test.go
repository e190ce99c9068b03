package gateway_test

// A spec committed in the gateway's process reaches its daemon from the
// commit's offer alone: the gateway does not also read every pending spec
// and command of its sessions for it.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
	"computeplane/internal/gateway"
	"computeplane/internal/nodework"
	"computeplane/internal/uow"
)

// Each of deliveries specs, pushed in a unit of work of this process (as
// a call's), is sent to the daemon; the gateway's reads of every pending
// spec and command (dispatches, two statements each) are its loop's
// ticks only, none per delivery. Not parallel: it reads the process's
// counters.
func TestAnOfferedSpecIsSentWithoutTheGatewaysRead(t *testing.T) {
	w := setup(t)
	n := w.newNode(t)
	conn := w.session(t, n)
	handled(t, conn)
	notifier := w.env.Host.Notifier()

	const deliveries = 10
	all0 := gatewayStat("dispatches")
	start := time.Now()
	for range deliveries {
		u, err := uow.Run(t.Context(), w.env.Store, false, func(ctx context.Context, u *uow.Unit) error {
			return nodework.PushSpec(ctx, u.Tx, n.nodeID)
		})
		require.NoError(t, err)
		notifier.WakeUnit(u) // as the envelope does after the commit
		var gen int64
		require.NoError(t, w.env.Store.Pool().QueryRow(t.Context(), `select generation from node_specs where node_id = $1`, n.nodeID).Scan(&gen))
		for {
			m, err := recv(t.Context(), conn)
			require.NoError(t, err)
			if m.Type == agentproto.TypeSpec && m.Spec.Generation == gen {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // a wake's read would run meanwhile
	}
	elapsed := time.Since(start)
	all := gatewayStat("dispatches") - all0
	t.Logf("%d specs delivered in %v: %d reads of every session's pending work", deliveries, elapsed, all)
	assert.LessOrEqual(t, all, int64(elapsed/gateway.Poll)+1, "only the loop's ticks read the pending work")
}
